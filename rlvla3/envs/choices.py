"""The values an env's own packages accept for what a user names (task, robot, cameras), read from
those packages in the env's interpreter, so that a misspelt value is refused
in one line, naming the valid ones, before any rank starts (`hosting.check_env`).

Run as `<env interpreter> -m rlvla3.envs.choices '<env config as JSON>'`: it prints one JSON line,
the list of refusals (empty: every value is valid). The top level imports the standard library
only: it runs under interpreters with other packages (LIBERO's numpy 1).
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def refuse(field: str, value, valid) -> str:
    return f"{field}={value!r} is not one of {sorted(valid)}"


def robosuite_refusals(e) -> list[str]:
    from robosuite.environments.base import REGISTERED_ENVS
    from robosuite.robots import ROBOT_CLASS_MAPPING

    if e.task not in REGISTERED_ENVS:
        return [refuse("env.task", e.task, REGISTERED_ENVS)]
    if e.robot not in ROBOT_CLASS_MAPPING:
        return [refuse("env.robot", e.robot, ROBOT_CLASS_MAPPING)]
    import robosuite

    # The cameras are the arena's and the robot's: the model holds them (no renderer needed).
    env = robosuite.make(e.task, robots=e.robot, has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False)
    return camera_refusals(e.cameras, env.sim.model.camera_names)


def metaworld_refusals(e) -> list[str]:
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.policies import ENV_POLICY_MAP

    tasks = set(ALL_V3_ENVIRONMENTS) & set(ENV_POLICY_MAP)
    if e.task not in tasks:
        return [refuse("env.task", e.task, tasks)]
    model = ALL_V3_ENVIRONMENTS[e.task]().model
    return camera_refusals(e.cameras, [model.camera(i).name for i in range(model.ncam)])


def maniskill_refusals(e) -> list[str]:
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    from mani_skill.utils.registration import REGISTERED_ENVS

    return [refuse("env.task", e.task, REGISTERED_ENVS)] if e.task not in REGISTERED_ENVS else []


def libero_refusals(e) -> list[str]:
    """A LIBERO-PRO suite's files, which the installed package does not always ship: each task's
    BDDL file, and with env.init_states=fixed its fixed states (sampled placements need only the
    BDDL; the run records them as sampled in init_states.json). The standard suites always ship."""
    import os

    from rlvla3.envs.libero_env import perturbation_of

    if not perturbation_of(e.suite)[1]:
        return []
    from libero.libero import benchmark

    suite = benchmark.get_benchmark_dict()[e.suite](task_order_index=0)
    for t in e.task_ids:
        bddl = suite.get_task_bddl_file_path(t)
        if not os.path.isfile(bddl):
            return [f"env.suite={e.suite}: task {t}'s BDDL file {bddl} is not in the installed LIBERO package; "
                    "this perturbation cannot run here"]
        if e.init_states == "fixed":
            try:
                suite.get_task_init_states(t)
            except FileNotFoundError as err:   # its message names the file it looked for
                return [f"env.suite={e.suite}: task {t}'s fixed initial states are not in the installed LIBERO package "
                        f"({str(err).split('. ')[0]}); env.init_states=sampled draws placements from its BDDL regions "
                        "instead (recorded as sampled in the run's init_states.json)"]
    return []


def camera_refusals(wanted, available) -> list[str]:
    missing = [c for c in wanted if c not in available]
    return [f"env.cameras={list(wanted)}: no camera {missing} in this scene; it has {sorted(available)}"] if missing else []


CHECKS = {"robosuite": robosuite_refusals, "metaworld": metaworld_refusals, "maniskill": maniskill_refusals,
          "libero": libero_refusals}
"""Envs whose packages list what they accept (toy and emulated take any task; LIBERO's suites, task
ids and cameras are checked from its own tables before any interpreter starts, checks.libero, and
a LIBERO-PRO suite's files here;
robocasa's tasks register only with its optional package, which says so itself when missing)."""


def refusals(env: dict) -> list[str]:
    check = CHECKS.get(env["name"])
    return check(SimpleNamespace(**env)) if check else []


def main(env: dict) -> None:
    """Import what an env process imports (a failure exits non-zero, naming the missing module),
    then print the refusals as one JSON line."""
    import importlib

    from rlvla3.envs import SIM_MODULES
    from rlvla3.envs.base import child_env_vars

    child_env_vars()   # headless GL: as in an env process
    importlib.import_module("numpy")
    importlib.import_module("rlvla3.envs.worker")
    if SIM_MODULES.get(env["name"]):
        importlib.import_module(SIM_MODULES[env["name"]])
    print(json.dumps(refusals(env)))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
