"""`maniskill`: ManiSkill3 (SAPIEN) tasks that need no downloaded assets (PickCube-v1, PushCube-v1,
StackCube-v1, ...), under its own interpreter (env.python: .venv-maniskill, scripts/setup_maniskill.sh).

SAPIEN renders through Vulkan, which on a machine without a GPU means Mesa's lavapipe; Debian 12's
(22.3.6) lacks an extension SAPIEN needs (VK_KHR_external_semaphore_fd, Mesa >= 24.3), so the
setup script unpacks Mesa's Vulkan driver from bookworm-backports into .mesa-backports/ and this
module points the Vulkan loader at it (the system's GL stack, which MuJoCo envs use, is untouched).
With the CPU physics backend ManiSkill3 runs one env per process ("multiple environments need
the GPU backend"), which is how a Simulator hosts envs anyway: one child process each.

Observation: the sensor cameras' RGB (`env.cameras`, default the task's base_camera) at
`env.image_size`; proprio = the robot's joint positions (Panda: 7 arm + 2 fingers). Action: 7-D in
[-1, 1], `pd_ee_delta_pose` (end-effector position and rotation deltas, gripper). Success: the
task's `info["success"]`, reward 1, which ends the episode. Seeds: `reset(seed)` places the objects
and goal from the seed, the same in any process. Only numpy is imported at the top (the Simulator
side reads ACTION_DIM / PROPRIO_DIM); mani_skill and torch are imported in the env's own process.
"""
from __future__ import annotations

import os

import numpy as np

from .base import Obs

PROPRIO_DIM = 9
ACTION_DIM = 7
CONTROL_MODE = "pd_ee_delta_pose"
MESA_DIR = ".mesa-backports"   # under the source root: scripts/setup_maniskill.sh unpacks it there
INSTRUCTIONS = {"PickCube-v1": "pick up the cube and move it to the goal", "PushCube-v1": "push the cube to the goal",
                "StackCube-v1": "stack the red cube on the green cube", "PullCube-v1": "pull the cube to the goal"}


def use_backports_vulkan() -> None:
    """Point the Vulkan loader at the lavapipe of .mesa-backports/ and load that Mesa's own libdrm
    first (the driver needs a newer one than Debian 12's; a library loaded by absolute path
    satisfies the driver's later lookup by name)."""
    import ctypes
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / MESA_DIR   # envs.SOURCE_ROOT (envs/__init__ imports this module)
    icd = root / "usr/share/vulkan/icd.d/lvp_icd.json"
    if not icd.exists():
        raise RuntimeError(f"{icd} is missing: run bash scripts/setup_maniskill.sh (Mesa's lavapipe from bookworm-backports)")
    os.environ["VK_ICD_FILENAMES"] = str(icd)
    lib = root / "usr/lib/x86_64-linux-gnu"
    for name in ("libdrm.so.2", "libdrm_amdgpu.so.1"):
        ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)


class ManiSkillEnv:
    def __init__(self, cfg_env):
        use_backports_vulkan()
        import logging

        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks)

        # "CUDA device was not found ... Rendering might be disabled": it is not (lavapipe renders).
        logging.getLogger("mani_skill").setLevel(logging.ERROR)

        self.c = cfg_env
        size = cfg_env.image_size
        self.env = gym.make(cfg_env.task, obs_mode="rgb", control_mode=CONTROL_MODE, num_envs=1, sim_backend="cpu",
                            sensor_configs={"width": size, "height": size}, max_episode_steps=10**9)
        self.cams = list(cfg_env.cameras)
        self.instruction = cfg_env.instruction or INSTRUCTIONS.get(cfg_env.task, cfg_env.task.split("-")[0])

    def _obs(self, obs) -> Obs:
        sensors = obs["sensor_data"]
        missing = [c for c in self.cams if c not in sensors]
        if missing:
            raise ValueError(f"env.cameras={self.cams}: {self.c.task} has no camera {missing}; it has {sorted(sensors)}")
        images = np.stack([sensors[c]["rgb"][0].numpy() for c in self.cams]).astype(np.uint8)
        return Obs(images, obs["agent"]["qpos"][0].numpy().astype(np.float32)[:PROPRIO_DIM], self.instruction)

    def reset(self, seed: int) -> Obs:
        obs, _ = self.env.reset(seed=int(seed))
        return self._obs(obs)

    def step(self, action: np.ndarray, observe: bool = True):   # SAPIEN draws inside its batched step
        obs, _, _, _, info = self.env.step(np.asarray(action, np.float32)[None])
        success = bool(info["success"][0])
        return self._obs(obs), float(success), success, success, 0.0

    def close(self) -> None:
        self.env.close()
