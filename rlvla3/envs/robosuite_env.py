"""`robosuite`: real MuJoCo manipulation (Lift with a Panda by default), rendered headless.

Headless GL: MUJOCO_GL=egl (Mesa software EGL, the default here) or MUJOCO_GL=osmesa (needs
libosmesa6; PYOPENGL_PLATFORM=osmesa is set for you). Same speed on CPU.

Observation: one RGB image per camera (top-down rows, "opencv" convention) and proprio
(end-effector position 3, quaternion 4, gripper joint positions 2). Action in [-1, 1], by
env.arm_controller: OSC_POSE, 7-D end-effector delta (position 3, axis-angle 3) + gripper (-1
open, +1 close); OSC_POSITION, 4-D position delta 3 + gripper, the hand keeping its reset
orientation (fewer action dims for tasks that never turn the hand: Lift, Stack, PickPlaceCan).
Soft resets (hard_reset=False: ~20 ms instead of ~1 s, flat memory). Fast render: MSAA and
reflections off on the offscreen context (~3x faster, same-looking images).
Success = env._check_success() after each step; reward 1 on success, which ends the episode.
`expert_action()`: the task's scripted expert (experts.py) on the privileged state, for
demonstrations (Lift, Stack, PickPlaceCan, Door).
"""
from __future__ import annotations

import numpy as np

from .base import LazyCameras, Obs, child_env_vars, for_controller

PROPRIO_DIM = 9
INSTRUCTIONS = {"Lift": "lift the cube", "Stack": "stack the red cube on the green cube",
                "Door": "open the door", "PickPlaceCan": "put the can in its bin"}


def make_robosuite(cfg_env):
    """A robosuite env of `cfg_env` (any registered task, e.g. RoboCasa's): offscreen cameras with
    top-down rows, soft resets, no horizon or done of its own (Episode handles both)."""
    child_env_vars()
    import robosuite
    import robosuite.macros as macros

    macros.IMAGE_CONVENTION = "opencv"
    return robosuite.make(
        cfg_env.task, **controller_kwargs(cfg_env), robots=cfg_env.robot, has_renderer=False, has_offscreen_renderer=True,
        use_camera_obs=True, camera_names=list(cfg_env.cameras), camera_heights=cfg_env.image_size,
        camera_widths=cfg_env.image_size, control_freq=cfg_env.control_freq, horizon=10**9,
        hard_reset=False, reward_shaping=False, ignore_done=True,
        # The model is drawn at construction (Lift: the cube's size) from env.rng: one fixed seed
        # makes it the same in every env process, so one reset seed is one state in any env (a
        # grpo group); reset(seed) re-seeds env.rng for the per-episode draws.
        seed=0)


def controller_kwargs(cfg_env) -> dict:
    """robosuite's own controller config with the arm part swapped for env.arm_controller (the
    default OSC_POSE keeps robosuite's default config untouched)."""
    if cfg_env.arm_controller == "OSC_POSE":
        return {}
    from robosuite.controllers import load_composite_controller_config, load_part_controller_config

    config = load_composite_controller_config(robot=cfg_env.robot)   # the robot's own default
    arm = load_part_controller_config(default_controller=cfg_env.arm_controller)
    for name, part in config["body_parts"].items():
        if part["type"] == "OSC_POSE":   # an arm: keep its gripper, change how the arm moves
            config["body_parts"][name] = {**arm, "gripper": part.get("gripper", {"type": "GRIP"})}
    return {"controller_configs": config}


def seed_robosuite(env, seed: int) -> None:
    """Make `env`'s next reset a function of `seed` alone. robosuite 1.5 draws object placement
    and the robot's initial joint noise from one numpy Generator, `env.rng`, which the
    placement samplers hold by reference: re-seed that object in place (a new Generator would
    leave the samplers on the old one). numpy's global RNG is seeded too, for tasks that use it."""
    env.rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
    np.random.seed(seed % 2**32)


class RobosuiteEnv:
    def __init__(self, cfg_env):
        self.c = cfg_env
        self.env = make_robosuite(cfg_env)
        if cfg_env.fast_render:
            self._fast_render()
        self.cameras = LazyCameras(self.env, cfg_env.cameras)
        self.cameras.install()   # soft resets keep the sensors
        self.instruction = cfg_env.instruction or INSTRUCTIONS.get(cfg_env.task, cfg_env.task)
        from .experts import EXPERTS
        self.expert = EXPERTS[cfg_env.task](self.env) if cfg_env.task in EXPERTS else None
        self.raw: dict = {}

    def _fast_render(self) -> None:
        """Rebuild the offscreen context with MSAA off (read at context creation) and reflections off.

        The old context is freed *before* the new one is made: freeing a GL context releases
        whatever context is current, so an old context collected after the new one was built
        left the new one unbound and every frame garbage (tests/envs/test_envs.py compares frames)."""
        import gc

        import mujoco
        from robosuite.utils.binding_utils import MjRenderContextOffscreen

        sim = self.env.sim
        geomgroup = np.array(sim._render_context_offscreen.vopt.geomgroup)
        sim._render_context_offscreen = None
        gc.collect()   # runs the old context's __del__ (frees its MjrContext and GL context) now
        sim.model.vis.quality.offsamples = 0
        ctx = MjRenderContextOffscreen(sim, device_id=self.env.render_gpu_device_id)
        ctx.vopt.geomgroup[:] = geomgroup
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        ctx.gl_ctx.make_current()

    def reset(self, seed: int) -> Obs:
        seed_robosuite(self.env, seed)
        if self.expert is not None:
            self.expert.reset()
        self.cameras.wanted = True
        return self._obs(self.env.reset())

    def step(self, action: np.ndarray, observe: bool = True):
        self.cameras.wanted = observe
        raw, reward, _, _ = self.env.step(np.asarray(action, np.float64))
        success = bool(self.env._check_success())
        if success and not observe:
            raw = self.cameras.redraw()
        return self._obs(raw), float(success), success, success, 0.0

    def expert_action(self) -> np.ndarray:
        if self.expert is None:
            raise NotImplementedError(f"robosuite task {self.c.task!r} has no scripted expert yet "
                                      f"(experts exist for {sorted(__import__('rlvla3.envs.experts', fromlist=['EXPERTS']).EXPERTS)})")
        return for_controller(self.expert.act(self.raw).astype(np.float32), self.c.arm_controller, self.c.task)

    def _obs(self, raw: dict) -> Obs:
        self.raw = raw
        images = np.stack([raw[f"{cam}_image"] for cam in self.c.cameras])
        proprio = np.concatenate([raw["robot0_eef_pos"], raw["robot0_eef_quat"], raw["robot0_gripper_qpos"]])
        return Obs(images, proprio.astype(np.float32), self.instruction)

    def close(self) -> None:
        self.env.close()
