"""`robocasa`: RoboCasa kitchen tasks through robosuite's registry (an optional backend).

RoboCasa's code is on PyPI (praxis-robocasa, rlinf-robocasa365, rpent-robocasa365) but its
kitchen assets are not: those packages carry a 3.5 MB stub of the asset folder, and the fixtures,
textures and objects come only as archives from utexas.box.com (docs/envs.md). It also pins its
own mujoco and numpy. It therefore lives behind a lazy import: nothing here imports it until an env is made,
and a missing install fails at once with what to do (`require_robocasa`). Importing robocasa
registers its tasks in robosuite, so `robosuite.make("<Task>", robots="PandaOmron", ...)` builds
them; the instruction is the episode's `get_ep_meta()["lang"]`, success `_check_success()`.

The policy's action for a mobile manipulator is laid out in a fixed, named order, and
`to_env_action` scatters it to where robosuite's composite controller reads each part
(`_action_split_indexes`, which differs between robots and controller configs):

    POLICY_PARTS  right [6]: end-effector delta, position 3 + axis-angle 3 (OSC_POSE)
                  right_gripper [1]: -1 open, +1 close
                  base [3]: forward, sideways, yaw velocity
                  torso [1]: lift velocity
                  base_mode [1]: > 0 drive the base (the arm keeps its goal), <= 0 move the arm

RoboCasa itself could not be installed on these machines: the mapping is tested on robosuite's
own PandaOmron (Omron mobile base + Panda arm), which exists here (tests/envs/test_envs.py).
"""
from __future__ import annotations

import numpy as np

from .base import Obs, child_env_vars

POLICY_PARTS = (("right", 6), ("right_gripper", 1), ("base", 3), ("torso", 1), ("base_mode", 1))
PROPRIO_DIM = 9 + 3   # eef position 3, quaternion 4, gripper 2, base position 3
ACTION_DIM = sum(n for _, n in POLICY_PARTS)

INSTALL = ("RoboCasa is not installed (its kitchen assets are not on PyPI): in its own environment (then "
           "env.python=<venv>/bin/python), `pip install rlinf-robocasa365` with its assets from utexas.box.com under "
           "ROBOCASA_ASSETS_PATH, or `git clone https://github.com/robocasa/robocasa && pip install -e robocasa && "
           "python robocasa/robocasa/scripts/download_kitchen_assets.py && python "
           "robocasa/robocasa/scripts/setup_macros.py` (it asserts its own mujoco and numpy versions)")


def require_robocasa():
    """Import robocasa (registering its tasks in robosuite) or fail saying what is missing."""
    try:
        import robocasa  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"env.name=robocasa: {INSTALL}. Import error: {e}") from e
    except AssertionError as e:   # robocasa asserts exact mujoco/numpy versions at import
        raise RuntimeError(f"env.name=robocasa: robocasa refused this environment's versions ({e}); {INSTALL}") from e


def action_layout(robot, env_dim: int) -> dict[str, tuple[int, int]]:
    """Where each policy part lives in robosuite's action vector for `robot` (its composite
    controller's split), plus `base_mode` as the last entry when the controller reads one."""
    split = dict(robot.composite_controller._action_split_indexes)
    used = max(stop for _, stop in split.values())
    if env_dim == used + 1:
        split["base_mode"] = (used, used + 1)
    missing = [p for p, n in POLICY_PARTS if p not in split]
    if missing:
        raise ValueError(f"robot {type(robot).__name__} has no action part(s) {missing} (it has {sorted(split)}): "
                         f"the robocasa adapter drives a mobile manipulator such as PandaOmron")
    for part, n in POLICY_PARTS:
        start, stop = split[part]
        if stop - start != n:
            raise ValueError(f"robot part {part!r} takes {stop - start} action values, the policy gives {n}")
    return split


def to_env_action(policy_action: np.ndarray, layout: dict[str, tuple[int, int]], env_dim: int) -> np.ndarray:
    """Scatter the policy's action (POLICY_PARTS order) into robosuite's action vector."""
    out = np.zeros(env_dim, np.float64)
    i = 0
    for part, n in POLICY_PARTS:
        start, stop = layout[part]
        out[start:stop] = policy_action[i:i + n]
        i += n
    return out


class RobocasaEnv:
    def __init__(self, cfg_env):
        from .robosuite_env import make_robosuite

        child_env_vars()
        require_robocasa()
        self.c = cfg_env
        self.env = make_robosuite(cfg_env)
        self.layout = action_layout(self.env.robots[0], self.env.action_dim)
        self.instruction = cfg_env.instruction

    def reset(self, seed: int) -> Obs:
        from .robosuite_env import seed_robosuite

        seed_robosuite(self.env, seed)   # RoboCasa's kitchens are robosuite envs: the same env.rng
        raw = self.env.reset()
        self.instruction = self.c.instruction or self.env.get_ep_meta().get("lang", self.c.task)
        return self._obs(raw)

    def step(self, action: np.ndarray, observe: bool = True):
        raw, _, _, _ = self.env.step(to_env_action(action, self.layout, self.env.action_dim))
        success = bool(self.env._check_success())
        return self._obs(raw), float(success), success, success, 0.0

    def _obs(self, raw: dict) -> Obs:
        images = np.stack([raw[f"{cam}_image"] for cam in self.c.cameras])
        proprio = np.concatenate([raw["robot0_eef_pos"], raw["robot0_eef_quat"], raw["robot0_gripper_qpos"],
                                  raw["robot0_base_pos"]])
        return Obs(images, proprio.astype(np.float32), self.instruction)

    def close(self) -> None:
        self.env.close()
