"""`python -m rlvla3.bench throughput [--env emulated|robosuite|toy|libero|maniskill] [--ladder] [overrides...]`

Runs the same workload in several modes back to back, in one process, and prints for each:
steady-state env steps/s (versions after the first), the ratio to the best sync baseline,
pipeline efficiency (achieved / the slowest stage's measured capacity), and CPU-seconds per
role. `--ladder` measures the paper's ablation: sync colocated and disaggregated, then
+overlap, +dynamic batching (env-level), +streaming (eta = 0), then eta = 1 and eta = 2.

The default workload is the emulated simulator with heavy-tailed step latency and slow resets
(no CPU spent simulating, so the numbers measure the runtime, not this machine's cores).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path

from ..cluster.compose import compose
from ..cluster.local import cpu_warning, run_local
from ..engine.metrics import read_summaries, steady_throughput
from ..world import derive, sharding_plan

WORKLOADS = {
    "emulated": ["env=emulated", "env.num_envs=16", "cluster.sim_ranks=2", "sharding.groups_per_rank=4", "algo.segment_steps=16",
                 "algo.rollout_batch=256", "algo.global_batch=128", "algo.micro_batch=64", "algo.max_versions=6",
                 "policy.patch=8", "generator.b_max=16", "generator.t_max_ms=5"],
    "robosuite": ["env=robosuite_lift", "env.num_envs=2", "algo.segment_steps=16", "algo.rollout_batch=64",
                  "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5", "sharding.groups_per_rank=2",
                  "generator.b_max=2"],
    # Paper-shaped: real robosuite envs, the Generator and Trainer emulated with a pi0.5-on-H100-like
    # profile (a forward ~28 ms at batch 1 + 3 ms a sample, 89 training samples/s, 0.2 s to publish).
    # 4 envs in 2 groups of 2 and a 20 ms window: a sample batched costs 3 ms against 31 ms alone, so
    # the Generator batches as a pi0.5 server would (with 2 envs it served batches of 1: 1.3x at most).
    "robosuite_pi05": ["env=robosuite_lift", "env.num_envs=4", "algo.segment_steps=16", "algo.rollout_batch=64",
                       "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5", "sharding.groups_per_rank=2",
                       "generator.b_max=4", "generator.t_max_ms=20", "policy=emulated", "policy.infer_fixed_ms=28",
                       "policy.infer_per_sample_ms=3", "policy.train_samples_per_s=89", "policy.weight_sync_ms=200"],
    "toy": ["+experiment=toy", "algo.max_versions=6", "algo.update_epochs=1"],
    # ManiSkill3 PickCube under .venv-maniskill (one env a process: its CPU backend), 2 envs at 64x64.
    "maniskill": ["env=maniskill", "env.num_envs=2", "policy=tiny", "policy.patch=8", "algo.segment_steps=16",
                  "algo.rollout_batch=64", "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5",
                  "sharding.groups_per_rank=2", "generator.b_max=2"],
    # LIBERO's real scenes under .venv-libero (libero_spatial tasks 0-3, both cameras at 64x64).
    "libero": ["env=libero", "env.task_ids=[0,1,2,3]", "env.num_envs=4", "env.image_size=64", "policy=tiny",
               "policy.patch=16", "sharding.groups_per_rank=2", "algo.segment_steps=8", "algo.rollout_batch=32",
               "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5", "generator.b_max=4"],
}

SYNC = ["mode=sync"]
RUNGS_BASIC = [
    ("sync colocated", [*SYNC, "mode.placement=colocated"]),
    ("sync disaggregated", SYNC),
    ("async eta=1", ["mode=async", "mode.eta=1"]),
]
RUNGS_LADDER = [
    ("sync colocated", [*SYNC, "mode.placement=colocated"]),
    ("sync disaggregated", SYNC),
    ("+overlap", [*SYNC, "mode.overlap=true"]),
    ("+dynamic batching", [*SYNC, "mode.overlap=true", "mode.env_level=true"]),
    ("+streaming (eta=0)", ["mode=async", "mode.eta=0"]),
    ("eta=1", ["mode=async", "mode.eta=1"]),
    ("eta=2", ["mode=async", "mode.eta=2"]),
]


def read_metrics(run: Path) -> tuple[dict, dict]:
    """(cpu seconds per role, span totals per name summed over ranks)."""
    cpu, spans = defaultdict(float), defaultdict(lambda: [0, 0.0])
    for rec in read_summaries(run):
        cpu[rec["role"]] += rec["cpu_s"] + rec["cpu_children_s"]
        for name, (n, s) in rec["spans"].items():
            spans[name][0] += n
            spans[name][1] += s
    return dict(cpu), dict(spans)


def stage_capacities(cfg, spans: dict, history: list[dict]) -> dict[str, float]:
    """Samples/s each stage could sustain alone, from measured busy time."""
    out = {}
    rows = sum(h["env_steps"] for h in history)
    if spans.get("infer", [0, 0])[1] > 0:
        samples = rows * (1 + 1 / cfg.algo.segment_steps)  # + bootstrap requests
        out["generator"] = samples / spans["infer"][1] * cfg.cluster.gen_ranks
    if spans.get("train", [0, 0])[1] > 0:
        out["trainer"] = rows * cfg.algo.update_epochs / spans["train"][1] * cfg.cluster.train_ranks
    e = cfg.env
    if e.name == "emulated":
        import math

        per_step = e.step_ms / 1e3 * math.exp(e.step_sigma ** 2 / 2) + e.reset_ms / 1e3 / e.horizon
        out["simulator"] = e.num_envs / per_step
    elif spans.get("sim_step", [0, 0])[0]:
        n, s = spans["sim_step"]
        per_step = s / n + spans.get("reset", [0, 0.0])[1] / max(rows, 1)
        cores = cfg.cluster.cores or os.cpu_count() or 1
        out["simulator"] = min(e.num_envs, cores) / per_step if sharding_plan(cfg) else float("nan")
    return out


def measure(label: str, overrides: list[str], root: Path, timeout: float) -> dict:
    cfg = compose([*overrides, "runtime.tensorboard=false", "runtime.progress=false"])
    run = root / label.replace(" ", "_").replace("+", "p").replace("(", "").replace(")", "").replace("=", "")
    proc = run_local(cfg, run, timeout=timeout, capture=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: run failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
    summary = json.loads((run / "summary.json").read_text())
    cpu, spans = read_metrics(run)
    thr = steady_throughput(summary["history"])
    caps = stage_capacities(cfg, spans, summary["history"])
    slowest = min(caps.values()) if caps else float("nan")
    return {"label": label, "steps_per_s": thr, "capacity": caps, "efficiency": thr / slowest,
            "cpu_s": cpu, "run": str(run), "warning": cpu_warning(cfg, derive(cfg))}


def report(results: list[dict]) -> str:
    sync = [r for r in results if r["label"].startswith("sync")]
    best = max(sync, key=lambda r: r["steps_per_s"]) if sync else results[0]
    lines = [f"{'configuration':24s} {'steps/s':>9s} {'vs best sync':>13s} {'pipeline eff.':>14s}  "
             f"CPU-s per role (bottleneck capacities, samples/s)"]
    for r in results:
        cpu = " ".join(f"{k}={v:.1f}" for k, v in sorted(r["cpu_s"].items()))
        caps = " ".join(f"{k}={v:.0f}" for k, v in sorted(r["capacity"].items()))
        lines.append(f"{r['label']:24s} {r['steps_per_s']:9.1f} {r['steps_per_s'] / best['steps_per_s']:12.2f}x "
                     f"{r['efficiency']:13.0%}  {cpu} ({caps})")
    asyncs = [r for r in results if not r["label"].startswith("sync")]
    if asyncs:
        top = max(asyncs, key=lambda r: r["steps_per_s"])
        lines.append(f"headline: {top['label']} / best sync ({best['label']}) = "
                     f"{top['steps_per_s'] / best['steps_per_s']:.2f}x ({(top['steps_per_s'] / best['steps_per_s'] - 1):+.1%})")
    warnings = {r["warning"] for r in results if r["warning"]}
    lines += sorted(warnings)
    return "\n".join(lines)


def run(a) -> int:
    """Each rung of the (basic or full) ladder on the chosen workload, then the table."""
    root = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-bench-"))
    rungs = RUNGS_LADDER if a.ladder else RUNGS_BASIC
    results = []
    for label, mode in rungs:
        r = measure(label, [*WORKLOADS[a.env], *a.overrides, *mode], root, a.timeout)
        print(f"  {label:24s} {r['steps_per_s']:8.1f} steps/s", flush=True)
        results.append(r)
        (root / "bench.json").write_text(json.dumps(results, indent=1))  # kept if a later one fails
    text = report(results)
    print(f"\nworkload: {a.env} {' '.join(a.overrides)}\n{text}\nrun folders: {root}")
    (root / "bench.json").write_text(json.dumps(results, indent=1))
    return 0
