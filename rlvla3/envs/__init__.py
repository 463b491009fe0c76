"""Env adapters behind one small interface, and the observation and action sizes of each.

This package imports no third-party module at its top: Simulator ranks never import torch. Heavy simulators
(robosuite, mani_skill) are imported lazily inside the child process that hosts the env.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EnvDims:
    """Sizes of one observation and action of `cfg.env`, from config alone (no simulator import)."""

    cameras: int
    proprio_dim: int
    action_dim: int


def env_dims(cfg) -> EnvDims:
    """The EnvDims of `cfg.env` (cfg: RunConfig); `world.spec` adds the policy's side."""
    e = cfg.env
    if e.name == "toy":
        from .toy import ACTION_DIM, PROPRIO_DIM
        cams, prop, act = 1, PROPRIO_DIM, ACTION_DIM
    elif e.name == "robosuite":
        from .base import ACTION_DIMS
        from .robosuite_env import PROPRIO_DIM
        cams, prop, act = len(e.cameras), PROPRIO_DIM, ACTION_DIMS[e.arm_controller]
    elif e.name == "robocasa":
        from .robocasa_env import ACTION_DIM, PROPRIO_DIM
        cams, prop, act = len(e.cameras), PROPRIO_DIM, ACTION_DIM
    elif e.name == "metaworld":
        from .metaworld_env import ACTION_DIM, PROPRIO_DIM
        cams, prop, act = len(e.cameras), PROPRIO_DIM, ACTION_DIM
    elif e.name == "libero":
        from .base import ACTION_DIMS
        from .libero_env import PROPRIO_DIM
        cams, prop, act = len(e.cameras), PROPRIO_DIM, ACTION_DIMS[e.arm_controller]
    elif e.name == "maniskill":
        from .maniskill_env import ACTION_DIM, PROPRIO_DIM
        cams, prop, act = len(e.cameras), PROPRIO_DIM, ACTION_DIM
    elif e.name == "emulated":
        cams, prop, act = 1, e.proprio_dim, e.action_dim
    else:
        raise ValueError(f"env.name={e.name!r} is unknown")
    return EnvDims(cams, prop, act)


def make_env(cfg, env_id: int):
    """One single env of `cfg.env` (called inside the process that will host it)."""
    name = cfg.env.name
    if name == "toy":
        from .toy import ToyEnv
        return ToyEnv(cfg.env)
    if name == "emulated":
        from .emulated import EmulatedEnv
        return EmulatedEnv(cfg.env, env_id)
    if name == "robosuite":
        from .robosuite_env import RobosuiteEnv
        return RobosuiteEnv(cfg.env)
    if name == "metaworld":
        from .metaworld_env import MetaWorldEnv
        return MetaWorldEnv(cfg.env)
    if name == "robocasa":
        from .robocasa_env import RobocasaEnv
        return RobocasaEnv(cfg.env)
    if name == "libero":
        from .libero_env import LiberoEnv
        return LiberoEnv(cfg.env)
    if name == "maniskill":
        from .maniskill_env import ManiSkillEnv
        return ManiSkillEnv(cfg.env)
    raise ValueError(f"env.name={name!r} is unknown")


def expert_tasks(cfg) -> list[str] | None:
    """Tasks (`env.task`) of `cfg.env` with a scripted expert (demonstrations), or None if all have
    one. LIBERO's tasks are `env.task_ids`, whose expert follows each task's BDDL goal: which ones
    have it is read in LIBERO's interpreter (tools/collect.refuse_tasks_without_expert)."""
    if cfg.env.name in ("toy", "metaworld"):   # Meta-World ships a scripted policy for every task
        return None
    if cfg.env.name == "robosuite":
        from .experts import EXPERTS
        return sorted(EXPERTS)
    return []


SOURCE_ROOT = Path(__file__).resolve().parents[2]   # the folder holding rlvla3/ (and .venv-libero)


def interpreter(cfg) -> str:
    """env.python as a path to run; a relative one is relative to SOURCE_ROOT (where
    scripts/setup_libero.sh puts .venv-libero/), not to wherever a rank happens to start."""
    return str(SOURCE_ROOT / cfg.env.python) if cfg.env.python else ""


# The module an env's simulator is imported as (what `env.python` must be able to import).
SIM_MODULES = {"libero": "libero.libero.envs", "robosuite": "robosuite", "robocasa": "robocasa", "metaworld": "metaworld",
               "maniskill": "mani_skill.envs", "toy": None, "emulated": None}


def in_process(cfg) -> bool:
    """toy and emulated envs are cheap and draw no GL context: they run inside the Simulator rank;
    rendering envs get one spawned child process each. env.in_process, when set, decides."""
    if cfg.env.python:
        return False   # another interpreter: necessarily a child process
    if cfg.env.in_process is not None:
        return cfg.env.in_process
    return cfg.env.name in ("toy", "emulated")
