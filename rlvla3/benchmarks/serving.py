"""`python -m rlvla3.bench serving --params 1e8 --generators 4 [--versions 8]`

Whether Generators keep serving while a version arrives: one real engine job (mpiexec, every
role) on the emulated workload, its policy `--params` float32 values (policy.emulated_params) that
Trainer 0 publishes to `--generators` Generators each version, 4 Simulators (1 env each) per
Generator, inference and training nearly free, env steps of 50 ms and async with eta = 9 so the
Simulators keep stepping while a version arrives (with 10 ms steps and eta = 2 they ran out of
credit while a publish was under way on 2 cores, and no request was left to overlap an
arrival). Each action request (a Simulator's `wait_action` span, minus the median forward) is put
in one of two sets by whether it overlapped a version arriving at its Generator (that
Generator's `comm` span of the weights, from the header to the swap): p50 and p99 of each set and
the ratio of the p99s. A Generator that stops serving while it receives shows a ratio far above
1; the target is <= 2.
"""
from __future__ import annotations

import tempfile
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

import numpy as np

from .. import config
from ..cluster.compose import compose
from ..cluster.local import run_local
from ..engine.metrics import read_spans
from ..world import derive
from .common import save_rows

WARMUP = 5   # requests left out per group: the first wait for the first weights (start-up)


def workload(params: float, gens: int, versions: int) -> list[str]:
    """Heavy-tailed env steps (log-normal sigma 0.5) keep the Simulators out of step with each
    other, so some are stepping whenever a version arrives; 9 versions of credit let them run on
    through a slow publish."""
    sims, T = 4 * gens, 25
    return ["env=emulated", f"env.num_envs={sims}", "env.step_ms=50", "env.step_sigma=0.5", "env.reset_ms=1",
            "env.horizon=100000", "policy=emulated", "policy.infer_fixed_ms=0", "policy.infer_per_sample_ms=0",
            "policy.train_samples_per_s=1e7", "policy.weight_sync_ms=0", f"policy.emulated_params={int(params)}",
            f"cluster.sim_ranks={sims}", f"cluster.gen_ranks={gens}", "cluster.train_ranks=1", "sharding.groups_per_rank=1",
            f"algo.segment_steps={T}", f"algo.rollout_batch={T * sims}", f"algo.global_batch={T * sims}",
            f"algo.micro_batch={T * sims}", f"algo.max_versions={versions}", "generator.b_max=1", "mode=async", "mode.eta=9",
            "runtime.tensorboard=false", "runtime.progress=false", "runtime.liveness_timeout=120"]


def arrivals(run: Path) -> dict[int, list[tuple[float, float]]]:
    """Generator rank -> the (start, end) of each version arriving there, in order."""
    out = defaultdict(list)
    for rank, _, rec in read_spans(run):
        if rec["n"] == "comm" and rec.get("what") == "weights":
            out[rank].append((rec["t"], rec["t"] + rec["d"]))
    return {r: sorted(v) for r, v in out.items()}


def overlaps(windows: list[tuple[float, float]], t0: float, t1: float) -> bool:
    i = bisect_right(windows, (t1, float("inf")))   # windows starting before t1
    return any(end > t0 for _, end in windows[max(0, i - 2):i])


def split_requests(run: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """(request waits during an arrival, the others, the median forward), in seconds."""
    world = derive(config.load(run))
    windows = arrivals(run)
    seen, during, outside, infer = defaultdict(int), [], [], []
    for _, _, rec in read_spans(run):
        if rec["n"] == "infer":
            infer.append(rec["d"])
        if rec["n"] != "wait_action":
            continue
        gid = rec["gid"]
        seen[gid] += 1
        if seen[gid] <= WARMUP:
            continue
        gen = world.gen_rank_of(world.groups[gid])
        (during if overlaps(windows.get(gen, []), rec["t"], rec["t"] + rec["d"]) else outside).append(rec["d"])
    return np.asarray(during), np.asarray(outside), float(np.median(infer)) if infer else 0.0


def run(a) -> int:
    root = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-serving-"))
    rows = []
    cases = [(float(p), int(g)) for p in a.params.split(",") for g in a.generators.split(",")]
    for params, gens in cases:
        run_dir = root / f"serving-{params:.0e}-g{gens}"
        proc = run_local(compose([*workload(params, gens, (a.versions or 8)), *a.overrides]), run_dir,
                         timeout=a.timeout, capture=True)
        if proc.returncode != 0:
            raise SystemExit(f"serving run {run_dir} failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
        during, outside, infer = split_requests(run_dir)
        if not during.size or not outside.size:
            raise SystemExit(f"{run_dir}: {during.size} requests during an arrival, {outside.size} outside: "
                             "nothing to compare (more --versions?)")
        pct = lambda x, q: float(np.percentile((x - infer) * 1e3, q))   # noqa: E731
        rows.append({"params": params, "generators": gens, "requests_during": int(during.size),
                     "requests_outside": int(outside.size), "p50_during_ms": pct(during, 50),
                     "p99_during_ms": pct(during, 99), "p50_outside_ms": pct(outside, 50),
                     "p99_outside_ms": pct(outside, 99)})
        rows[-1]["p99_ratio"] = rows[-1]["p99_during_ms"] / max(rows[-1]["p99_outside_ms"], 1e-9)
    print(f"{'params':>8} {'gens':>4} {'during':>7} {'outside':>7} {'p50 in ms':>9} {'p99 in ms':>9} "
          f"{'p50 out ms':>10} {'p99 out ms':>10} {'p99 in/out':>10}")
    for r in rows:
        print(f"{r['params']:>8.0e} {r['generators']:>4} {r['requests_during']:>7} {r['requests_outside']:>7} "
              f"{r['p50_during_ms']:>9.2f} {r['p99_during_ms']:>9.2f} {r['p50_outside_ms']:>10.2f} "
              f"{r['p99_outside_ms']:>10.2f} {r['p99_ratio']:>10.2f}")
    print(f"run folders: {root}")
    save_rows(a.out, "serving.json", rows)
    return 0
