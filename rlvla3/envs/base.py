"""The env interface every adapter implements, and what a child process hosting one sets up.

A single env (toy.py, emulated.py, robosuite_env.py, metaworld_env.py, robocasa_env.py):
    reset(seed) -> Obs
    step(action float32[A] in [-1, 1]) -> (Obs, reward, terminated, success, delay_s)
where delay_s is extra latency the env asks its host to emulate (0 for real simulators).
hosting.py runs envs (horizon, chunks, resets, child processes); envs/__init__.py picks one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


@dataclass
class Obs:
    images: np.ndarray       # uint8 [cams, H, W, 3]
    proprio: np.ndarray      # float32 [P]
    instruction: str
    reset_seed: int = -1     # set by the host on an episode's first observation: the seed it reset from


@dataclass
class StepOut:
    obs: Obs                 # next observation (after auto-reset if the episode ended)
    reward: float
    terminated: bool
    truncated: bool
    success: bool
    error: bool              # the env raised or hung; the episode was cut and the env reset
    step_s: float            # wall time of the steps themselves
    reset_s: float           # wall time of the auto-reset (0 if none)
    delay_s: float           # emulated latency still to wait (emulated env only)
    steps: int = 1           # env steps executed (chunk actions until the episode ended)
    actions: np.ndarray | None = None   # expert steps: the action the expert took [steps, A]


def child_env_vars() -> None:
    """Headless GL default for rendering children (EGL; set MUJOCO_GL=osmesa to switch)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    if os.environ["MUJOCO_GL"] == "osmesa":
        os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")
