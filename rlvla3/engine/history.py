"""A run's record of each trained version (`summary.json`'s history, the metrics' scalars, the
progress line): what its shards brought (env steps, episodes, success, return, staleness) and
the means of its losses. Every Trainer sums its losses (`add`); Trainer 0 closes each version.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from .learners import LOSS_KEYS, STAT_KEYS
from .protocol import ShardReady


def stale_weights(rows: float, stale: float, w_sum: float, w_sq_sum: float) -> dict[str, float]:
    """What decoupled PPO's behaviour weights w = min(π_prox/π_behav, c) did to a version's stale rows:
    their mean w (E_behav[π_prox/π_behav] is 1 unclipped; the clip c takes mass off it) and their
    effective sample share (Σw)² / (n Σw²), 1 when every w is equal: a stale row with w near 0 is
    a row trained for nothing. Fresh rows have w = 1 exactly, so their part is taken off the sums.
    NaN when the version trained no stale row."""
    if stale <= 0:
        return {"stale_weight": float("nan"), "stale_ess": float("nan")}
    fresh = rows - stale
    w, w_sq = w_sum - fresh, w_sq_sum - fresh
    return {"stale_weight": w / stale, "stale_ess": w * w / (stale * w_sq) if w_sq > 0 else float("nan")}


def task_success(arrived: list[ShardReady]) -> dict[str, float]:
    """A multi-task run's per-task record of a version: success_task<t> and episodes_task<t> for
    each task an episode of the version ran (flat keys: every sink takes them as scalars)."""
    sums: dict[int, list[int]] = {}
    for m in arrived:
        for task, (eps, succ) in m.task_stats.items():
            got = sums.setdefault(int(task), [0, 0])
            got[0] += eps
            got[1] += succ
    out = {}
    for task in sorted(sums):
        eps, succ = sums[task]
        out[f"success_task{task}"], out[f"episodes_task{task}"] = succ / eps, eps
    return out


class History:
    def __init__(self, records: list[dict] | None = None):
        self.records: list[dict] = records if records is not None else []
        self.loss_sums = defaultdict(float)   # of the version being trained
        self.start_clock()

    def start_clock(self) -> None:
        """Times count from here: the Trainer calls it once its model, resume and sinks are set up."""
        self.t0 = self.t_version = time.time()

    def add(self, total: np.ndarray) -> None:
        """One optimizer step's all-reduced sums: [rows, *STAT_KEYS]."""
        for k, v in zip(STAT_KEYS, total[1:].tolist()):
            self.loss_sums[k] += v
        self.loss_sums["rows"] += float(total[0])

    def close(self, k: int, arrived: list[ShardReady], rows_trained: int) -> dict:
        """The record of version k + 1 (rollout step k trained on `arrived`), appended."""
        now = time.time()
        sums, self.loss_sums = self.loss_sums, defaultdict(float)
        rows = sums.pop("rows", 0.0) or 1.0
        stale, w_sq = sums.pop("stale", 0.0), sums.pop("behaviour_weight_sq", 0.0)
        eps = sum(m.episodes for m in arrived)
        rec = {"version": k + 1, "t": now - self.t0, "version_s": now - self.t_version,
               "env_steps": sum(m.env_steps for m in arrived), "rows_trained": rows_trained,
               "episodes": eps, "success": sum(m.successes for m in arrived) / eps if eps else float("nan"),
               "return": sum(m.return_sum for m in arrived) / eps if eps else float("nan"),
               "env_errors": sum(m.env_errors for m in arrived),
               "staleness_max": k - min((m.min_version for m in arrived), default=k),
               # off-policy share of the rows trained, and of the step's segments (grpo: its
               # groups) whose rows more than one version produced (weights swapped mid-segment)
               "stale_share": stale / rows,
               **stale_weights(rows, stale, sums["behaviour_weight"], w_sq),
               "mixed_segments": sum(m.min_version < m.max_version for m in arrived) / max(len(arrived), 1),
               **{f"loss_{key}": sums.get(key, 0.0) / rows for key in LOSS_KEYS}}
        rec.update(task_success(arrived))
        rec["steps_per_s"] = rec["env_steps"] / max(rec["version_s"], 1e-9)
        self.t_version = now
        self.records.append(rec)
        return rec

    def env_steps_until(self, version: int) -> int:
        """Env steps of the versions up to and including `version` (an evaluation's x axis)."""
        return sum(int(h["env_steps"]) for h in self.records if h["version"] <= version)
