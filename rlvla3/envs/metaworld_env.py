"""`metaworld`: Meta-World 3 (50 Sawyer tasks on MuJoCo), rendered headless, with its own
scripted policy per task as the expert.

Observation: one RGB image per camera and proprio = hand position (3) + gripper opening (1), the
first 4 entries of Meta-World's state vector; the rest of that vector (object poses, goal) is
privileged and only the expert sees it. Action: 4-D in [-1, 1] (hand position delta, gripper).
Instruction: the task name in words ("pick-place-v3" -> "pick place").
Success: Meta-World's `info["success"]`; reward 1 on success, which ends the episode.
Fast render (the default): MSAA, shadows, reflections and skybox off (~14 ms a step + 64x64
frame instead of ~115 ms). The corner cameras render upside down: their frames are turned 180°.
Per-episode seeds: `reset(seed)` draws the object and goal positions from the seed (and seeds the
task's RNG); the same seed gives the same state in any process. (The env is the task's own class,
not gymnasium's "Meta-World/MT1", whose wrapper picks one of 50 pre-drawn positions with an RNG of
its own and whose reset ignores its seed.)
"""
from __future__ import annotations

import numpy as np

from .base import Obs, child_env_vars

PROPRIO_DIM = 4
ACTION_DIM = 4


def instruction(task: str) -> str:
    """'pick-place-v3' -> 'pick place'."""
    words = task.split("-")
    return " ".join(words[:-1] if words[-1].startswith("v") else words)


class MetaWorldEnv:
    def __init__(self, cfg_env):
        child_env_vars()
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS
        from metaworld.policies import ENV_POLICY_MAP

        if cfg_env.task not in ENV_POLICY_MAP or cfg_env.task not in ALL_V3_ENVIRONMENTS:
            raise ValueError(f"env.task={cfg_env.task!r} is not a Meta-World task; e.g. {sorted(ENV_POLICY_MAP)[:5]}")
        self.c = cfg_env
        self.env = ALL_V3_ENVIRONMENTS[cfg_env.task](render_mode="rgb_array", camera_name=cfg_env.cameras[0],
                                                    width=cfg_env.image_size, height=cfg_env.image_size)
        # What MT1 sets up, minus its 50 fixed positions: the goal is in the state vector (the
        # scripted experts read it; the policy only ever sees the first PROPRIO_DIM entries),
        # positions are drawn per reset from its seed (reset below).
        u = self.env
        u._partially_observable, u._set_task_called = False, True
        u.__dict__.pop("sawyer_observation_space", None)   # a cached property bounded by the old flag
        self.cams = list(cfg_env.cameras)
        self.fast = cfg_env.fast_render
        if self.fast:
            self.env.unwrapped.model.vis.quality.offsamples = 0   # read when the render context is built
        self.expert = ENV_POLICY_MAP[cfg_env.task]()
        self.instruction = cfg_env.instruction or instruction(cfg_env.task)
        self.state = None
        self.frames: np.ndarray | None = None   # the last frames drawn (steps nobody looks at reuse them)
        self._flags_set = False

    def _render(self) -> np.ndarray:
        """One frame per camera (the renderer switches camera by name)."""
        import mujoco

        u = self.env.unwrapped
        frames = []
        for cam in self.cams:
            u.camera_name, u.mujoco_renderer.camera_name = cam, cam
            u.mujoco_renderer.camera_id = mujoco.mj_name2id(u.model, mujoco.mjtObj.mjOBJ_CAMERA, cam)
            img = self.env.render()
            if self.fast and not self._flags_set:
                viewer = u.mujoco_renderer._get_viewer("rgb_array")
                for f in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION, mujoco.mjtRndFlag.mjRND_SKYBOX):
                    viewer.scn.flags[f] = 0
                self._flags_set = True
                img = self.env.render()
            frames.append(img[::-1, ::-1] if cam.startswith("corner") else img)
        return np.ascontiguousarray(np.stack(frames))

    def reset(self, seed: int) -> Obs:
        # The positions of this episode, drawn from `seed` and frozen for the reset (its
        # reset_model runs twice and would otherwise draw twice), as MT1 does with its tasks.
        u = self.env
        space = u._random_reset_space
        u._last_rand_vec = np.random.default_rng(seed).uniform(space.low, space.high, size=space.low.size)
        u._freeze_rand_vec = True
        u.seed(int(seed))
        self.state, _ = u.reset()
        self.expert = type(self.expert)()
        return self._obs()

    def step(self, action: np.ndarray, observe: bool = True):
        self.state, _, _, _, info = self.env.step(np.asarray(action, np.float32))
        success = bool(info["success"])
        return self._obs(observe or success), float(success), success, success, 0.0

    def expert_action(self) -> np.ndarray:
        return np.clip(self.expert.get_action(self.state), -1, 1).astype(np.float32)

    def _obs(self, draw: bool = True) -> Obs:
        if draw or self.frames is None:
            self.frames = self._render()
        return Obs(self.frames, self.state[:PROPRIO_DIM].astype(np.float32), self.instruction)

    def close(self) -> None:
        self.env.close()
