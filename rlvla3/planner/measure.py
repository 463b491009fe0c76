"""A planner `Profile` measured from a run folder (`python -m rlvla3.plan profile <run>`).

What each field is fitted from (metrics/rank*.jsonl, summary.json, config.yaml):
  step_ms, step_sigma   `sim_step` spans. A span is one group step = the slowest of its k envs,
                        so sigma is the log-space spread of the spans and the per-env median is
                        mean(span) / E[max of k LogNormal(0, sigma)] (exact for that sigma; the
                        spread of a maximum understates the per-env spread, so sigma is a floor)
  reset_ms              mean `reset` span (an episode end's reset, timed apart from the step)
  episode_steps         env steps / episodes over the run
  infer_fixed_ms, infer_per_sample_ms
                        least-squares line through (`infer` batch samples, forward time)
  train_samples_per_s   rows trained per second of `train` span, per Trainer, per epoch
  weight_sync_ms        mean publish (Trainer) + mean load (Generator) `weight_sync` span
  request_overhead_ms   median `wait_action` - median `batch_wait` - median `infer` (medians:
                        a request held by the staleness gate is not engine overhead)
  shard_delay_ms        mean `shard_write` span
  max_batch, gpus_per_node, cores_per_*: from the run's config
Emulated envs sleep outside the step span, so a profile of an `emulated` run has their compute
only; measure real simulators.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from .. import config
from ..engine.metrics import read_spans
from .analytic import expected_max_lognormal
from .profile import PlannerError, Profile

MIN_SPANS = 5
"""Fewer spans of a kind than this cannot be fitted: the run was too short."""


def spans_by_role(run: Path) -> dict[tuple[str, str], list[dict]]:
    """(role, span name) -> span records of every rank."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for _, role, rec in read_spans(run):
        for r in role.split("+"):  # colocated ranks play generator+trainer
            out[(r, rec["n"])].append(rec)
    return out


def _need(spans: list[dict], what: str, run: Path) -> list[dict]:
    if len(spans) < MIN_SPANS:
        raise PlannerError(f"{run}: only {len(spans)} '{what}' spans; profile a longer run")
    return spans


def fit_step(spans: list[dict]) -> tuple[float, float]:
    """Per-env (median ms, log-normal sigma) from group-step spans (max of `envs` envs each)."""
    d = np.array([s["d"] for s in spans]) * 1e3
    k = int(round(np.median([s.get("envs", 1) for s in spans])))
    logs = np.log(np.maximum(d, 1e-6))
    sigma = float(np.std(logs))
    return float(d.mean() / expected_max_lognormal(k, 1.0, sigma)), sigma


def fit_infer(spans: list[dict]) -> tuple[float, float]:
    """Forward ms = a + b * samples, least squares.

    When the run cannot resolve the line (one batch size seen, or noise that makes either
    coefficient negative: a tiny forward on a busy machine) the whole forward is charged per
    sample, a line through the origin. That over-prices big batches rather than calling them
    free, which a zero slope would tell the planner."""
    n = np.array([s["batch"] for s in spans], float)
    t = np.array([s["d"] for s in spans]) * 1e3
    if len(np.unique(n)) > 1:
        b, a = np.polyfit(n, t, 1)
        if a >= 0 and b > 0:
            return float(a), float(b)
    return 0.0, float((n @ t) / (n @ n))


def profile_from_run(run: str | Path, name: str | None = None) -> Profile:
    run = Path(run)
    cfg = config.load(run)
    sp = spans_by_role(run)
    step_ms, sigma = fit_step(_need(sp[("simulator", "sim_step")], "sim_step", run))
    resets = sp[("simulator", "reset")]
    a, b = fit_infer(_need(sp[("generator", "infer")], "infer", run))
    train = _need(sp[("trainer", "train")], "train", run)
    rows, secs = sum(s.get("rows", 0) for s in train), sum(s["d"] for s in train)
    hist = json.loads((run / "summary.json").read_text())["history"]
    episodes = sum(h["episodes"] for h in hist)
    sync = [s["d"] for s in sp[("trainer", "weight_sync")]], [s["d"] for s in sp[("generator", "weight_sync")]]
    c = cfg.cluster
    local = c.name == "local"
    sim_cores = (c.cores or os.cpu_count() or 1) if local else c.sim_ranks * c.cpus_per_sim_rank
    return Profile(
        name=name or run.name,
        step_ms=step_ms,
        step_sigma=sigma,
        reset_ms=float(np.mean([s["d"] for s in resets]) * 1e3) if resets else 0.0,
        episode_steps=max(1, round(sum(h["env_steps"] for h in hist) / episodes)) if episodes else cfg.env.horizon,
        infer_fixed_ms=a,
        infer_per_sample_ms=b,
        max_batch=cfg.policy.max_batch,
        train_samples_per_s=rows / secs / cfg.algo.update_epochs,
        weight_sync_ms=1e3 * sum(float(np.mean(x)) for x in sync if x),
        cores_per_cpu_node=(c.cores or os.cpu_count() or 1) if local else c.cores_per_cpu_node,
        gpus_per_node=1 if local else c.gpus_per_node,
        cores_per_env=max(sim_cores / cfg.env.num_envs, 1e-3),
        request_overhead_ms=request_overhead_ms(sp),
        shard_delay_ms=float(np.mean([s["d"] for s in sp[("simulator", "shard_write")]]) * 1e3)
        if sp[("simulator", "shard_write")] else 0.0,
    )


def request_overhead_ms(sp) -> float:
    """Round trip beyond batching and the forward, from medians of the three spans."""
    med = {n: float(np.median([s["d"] for s in sp[(role, n)]])) * 1e3 if sp[(role, n)] else 0.0
           for role, n in (("simulator", "wait_action"), ("generator", "batch_wait"), ("generator", "infer"))}
    return max(med["wait_action"] - med["batch_wait"] - med["infer"], 0.0)
