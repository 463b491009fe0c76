"""`python -m rlvla3.plan validate`: the planner's models against the real engine.

For each rank count N and mode (sync, async), a planner `Layout` of N ranks (N/2 Simulators of
two groups of 4 envs, N/4 Generators, N/4 Trainers) is predicted by the analytic model and the
DES, and then run by the engine itself (`python -m rlvla3.launch` machinery: mpiexec, real MPI
messages, batching, credits, zarr shards, plans, weight transfer) with `env=emulated
policy=emulated` paying the same profile's costs by sleeping. Emulated ranks import no torch,
so 32 ranks fit on 2 cores. The engine is measured as the DES is: env steps completed by the
Simulators between the first and the last version published, over that time. (`rlvla3.bench`
counts the rows the Trainer consumed instead; over a short run with η = 1 that lags
production while the rollout gets one step ahead, by up to 8% here at 32 ranks; both are in
validate.json.) Error = predicted / measured - 1. Framework efficiency = measured / the DES of
the same plan with no engine overhead at all (`zero_overhead`): what the engine keeps of the
ideal pipeline for that workload.

Sync rows are the disaggregated lockstep baseline (η = 0, train after rollout); async rows are
env-level groups with overlap, streaming and η = 1.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from .analytic import analytic
from .des import simulate
from .layout import Layout, layout_sharding
from .network import ideal
from .overrides import emulation_overrides, override_strings, run_overrides
from .profile import PlannerError, Profile

GROUP_SIZE = 4
GROUPS_PER_SIM = 2
ASYNC_B_MAX = 16
ASYNC_T_MAX_MS = 5.0
VERSIONS = {"sync": 4, "async": 6}
"""Versions per engine run; the first is start-up and is not measured."""
LOAD_LIMIT = 0.7
"""Engine CPU-seconds per wall-second per core above which the measurement is marked: the
engine's own work (messages, shard writes) then delays the emulated costs and the model, which
has no CPU term, is not comparable."""


def layout_for(ranks: int, mode: str) -> Layout:
    """N ranks = N/2 Simulators + N/4 Generators + N/4 Trainers."""
    if ranks < 4 or ranks % 4:
        raise PlannerError(f"ranks={ranks}: use a multiple of 4 (N/2 Simulators, N/4 Generators, N/4 Trainers)")
    gens = ranks // 4
    envs_per_gen = 2 * GROUPS_PER_SIM * GROUP_SIZE  # two Simulator ranks per Generator
    if mode == "sync":
        return Layout(gens, gens, envs_per_gen, GROUP_SIZE, envs_per_gen, 0.0, 0, env_level=False, overlap=False,
                        streaming=False, groups_per_sim=GROUPS_PER_SIM)
    if mode == "async":
        return Layout(gens, gens, envs_per_gen, GROUP_SIZE, ASYNC_B_MAX, ASYNC_T_MAX_MS, 1, groups_per_sim=GROUPS_PER_SIM)
    raise PlannerError(f"mode={mode!r}: use sync or async")


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def engine_overrides(profile: Profile, layout: Layout, mode: str, versions: int | None = None) -> list[str]:
    plan = layout_sharding(profile, layout)
    tree = _merge(run_overrides(layout, plan), emulation_overrides(profile))
    tree = _merge(tree, {
        "cluster": {"sim_ranks": len(plan), "gen_ranks": layout.gen_gpus, "train_ranks": layout.train_gpus},
        "algo": {"max_versions": versions or VERSIONS[mode]},
        "mode": {"name": mode},
        "runtime": {"tensorboard": False, "progress": False, "liveness_timeout": 120.0, "startup_timeout": 300.0},
    })
    return override_strings(tree)


def measure(profile: Profile, ranks: int, mode: str, root: Path, seed: int = 0, versions: int | None = None) -> dict:
    from ..cluster.compose import compose
    from ..cluster.local import run_local
    from ..engine.metrics import read_summaries, steady_throughput

    lay = layout_for(ranks, mode)
    predicted = analytic(profile, lay).steps_per_s
    des = simulate(profile, lay, seed)
    pipeline = simulate(zero_overhead(profile), lay, seed).steps_per_s
    cfg = compose(["+experiment=emulated", *engine_overrides(profile, lay, mode, versions)])
    run = root / f"{mode}-{ranks}"
    t0 = time.monotonic()
    proc = run_local(cfg, run, timeout=900, capture=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} at {ranks} ranks: engine run failed (exit {proc.returncode}); see {run}\n"
                           f"{proc.stderr[-3000:]}")
    history = json.loads((run / "summary.json").read_text())["history"]
    measured = produced_per_s(run)
    cpu = sum(r["cpu_s"] + r["cpu_children_s"] for r in read_summaries(run))
    load = cpu / wall / (os.cpu_count() or 1)
    return {"ranks": ranks, "mode": mode, "envs": lay.num_envs, "analytic": predicted, "des": des.steps_per_s,
            "measured": measured, "consumed": steady_throughput(history),
            "err_analytic": predicted / measured - 1, "err_des": des.steps_per_s / measured - 1,
            "ideal_pipeline": pipeline, "efficiency": measured / pipeline,
            "cpu_load": load, "wall_s": wall, "run": str(run), "layout": dataclasses.asdict(lay)}


def zero_overhead(profile: Profile) -> Profile:
    """The same workload on an engine with no overhead of its own (no request latency beyond
    batching and the forward, shards on the Trainer the moment a segment ends) and an ideal
    site: the pipeline the engine's framework efficiency is measured against."""
    return dataclasses.replace(ideal(profile), request_overhead_ms=0.0, shard_delay_ms=0.0)


def produced_per_s(run: Path) -> float:
    """Env steps the Simulators completed between the first and the last version publish, per
    second (all times on rank 0's clock)."""
    from ..engine.metrics import read_records, read_spans

    published = sorted(rec["t"] for _, _, rec in read_records(run, "scalar") if rec["n"] == "steps_per_s")
    if len(published) < 2:
        raise RuntimeError(f"{run}: fewer than 2 versions published; run more versions")
    t0, t1 = published[0], published[-1]
    steps = sum(rec.get("envs", 0) for _, _, rec in read_spans(run)
                if rec["n"] == "sim_step" and t0 <= rec["t"] + rec["d"] < t1)
    return steps / (t1 - t0)


def table(rows: list[dict]) -> str:
    lines = [f"{'ranks':>5s} {'mode':5s} {'envs':>5s} {'analytic':>9s} {'DES':>9s} {'engine':>9s} "
             f"{'err analytic':>12s} {'err DES':>8s} {'ideal':>9s} {'efficiency':>10s} {'CPU load':>8s}"]
    for r in rows:
        mark = "  (CPU-bound: informational)" if r["cpu_load"] > LOAD_LIMIT else ""
        lines.append(f"{r['ranks']:5d} {r['mode']:5s} {r['envs']:5d} {r['analytic']:9.1f} {r['des']:9.1f} "
                     f"{r['measured']:9.1f} {r['err_analytic']:+11.1%} {r['err_des']:+7.1%} {r['ideal_pipeline']:9.1f} "
                     f"{r['efficiency']:10.0%} {r['cpu_load']:8.2f}{mark}")
    lines.append("ideal = the DES of the same plan with zero engine overhead (request_overhead_ms = shard_delay_ms = 0); "
                 "efficiency = engine / ideal")
    return "\n".join(lines)
