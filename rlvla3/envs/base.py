"""The env interface every adapter implements, and what a child process hosting one sets up.

A single env (toy.py, emulated.py, robosuite_env.py, metaworld_env.py, robocasa_env.py):
    reset(seed) -> Obs
    step(action float32[A] in [-1, 1], observe=True) -> (Obs, reward, terminated, success, delay_s)
where delay_s is extra latency the env asks its host to emulate (0 for real simulators).
observe=False says nobody will look at this step's images (an action inside a chunk: the policy
sees only the chunk's last observation), so a rendering env may skip drawing them and return the
last ones it drew; proprio, reward and success are always current. Rendering is most of a
rendered step on a CPU (a LIBERO step: ~11 ms of physics, ~36 ms per 64x64 camera).
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


# robosuite's operational-space arm controllers (robosuite and LIBERO): the action size with the
# gripper, and where an OSC_POSE action's entries sit in an OSC_POSITION one.
ACTION_DIMS = {"OSC_POSE": 7, "OSC_POSITION": 4}
POSITION_AND_GRIPPER = [0, 1, 2, 6]


def for_controller(action: np.ndarray, controller: str, task: str) -> np.ndarray:
    """An expert's OSC_POSE action as `controller` takes it: OSC_POSITION keeps position and
    gripper, and refuses an expert that turns the hand (that controller holds its orientation)."""
    if controller == "OSC_POSE":
        return action
    if np.abs(action[3:6]).max() > 1e-6:
        raise ValueError(f"the {task} expert turns the hand (rotation {action[3:6]}), which "
                         "env.arm_controller=OSC_POSITION cannot do: use env.arm_controller=OSC_POSE")
    return action[POSITION_AND_GRIPPER]


def child_env_vars() -> None:
    """Headless GL default for rendering children (EGL; set MUJOCO_GL=osmesa to switch)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    if os.environ["MUJOCO_GL"] == "osmesa":
        os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa")


class LazyCameras:
    """robosuite's camera observables (1.4 under LIBERO, 1.5) drawn only when `wanted`.

    robosuite samples every observable inside env.step (after the step's first physics substep),
    cameras included; swapping each camera's sensor for one that renders only when wanted keeps
    the observed frames exactly robosuite's own (same sampling point), and an unwanted step
    returns the camera's last frame instead of drawing a new one."""

    def __init__(self, env, cameras):
        self.env = env
        self.names = [f"{cam}_image" for cam in cameras]
        self.wanted = True
        self.frames: dict[str, np.ndarray] = {}

    def install(self) -> None:
        """Wrap the cameras' sensors; again after a hard reset, which puts robosuite's own back."""
        for name in self.names:
            observable = self.env._observables[name]
            if getattr(observable._sensor, "lazy_of", None) is not None:
                continue
            observable._sensor = self._lazy(name, observable._sensor)   # set_sensor would render to check it

    def _lazy(self, name: str, render):
        def sensor(obs_cache):
            if self.wanted or name not in self.frames:
                self.frames[name] = render(obs_cache)
            return self.frames[name]

        sensor.__modality__ = render.__modality__
        sensor.lazy_of = render
        return sensor

    def redraw(self) -> dict:
        """robosuite's observations of the current state, cameras drawn now (an episode that ended
        on an unobserved step: its last frame is drawn after the whole step, not its first substep)."""
        self.wanted = True
        return self.env._get_observations(force_update=True)
