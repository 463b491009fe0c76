"""The Trainer's compute half: what a learner is, and the emulated one.

The Trainer (trainer.py) decides *what* each optimizer step trains and owns versions, credits,
the ledger and logs; a learner decides *how*. Two learners share one interface:
`torch_learner.TorchLearner` (torch policies) and `EmulatedLearner` below (numpy only: it sleeps
for the profiled cost, so Trainer ranks can be emulated without torch).

    connect(transport, train_ranks)      data-parallel group (Trainer 0 picks the address)
    preload(name)                        read a shard ahead of its optimizer step (overlap)
    mark_lost(name, above)               after a rollback: rows of versions > above are stale
    bad                                  shards found corrupt (quarantined, trained as absent)
    train(slices, version) -> totals     one optimizer step; totals = [rows, *STAT_KEYS] summed
                                         over all Trainers (identical on every Trainer)
    forget(names)                        drop rows of a finished rollout step
    new_version()                        freeze π_prox for the rollout step that starts
    weights() -> float32[n]              flat parameters to publish
    state(mid_version) / load_state(s)   the learner's part of a checkpoint
    save(state, path) / load(path)       the checkpoint file format
    digest()                             sha256 of the parameters (DP ranks must agree)
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np

from ..policies.emulated import sleep_ms

ARRAY_KEYS = ("params", "step_start")   # the emulated checkpoint's arrays (the rest is JSON)
# The loss terms a learner sums per optimizer step, after the row count (algo.LossTerms' fields):
# LOSS_KEYS are logged as loss_<key> means; the sum of squared behaviour weights only serves the
# stale rows' effective sample share (trainer.py).
LOSS_KEYS = ("policy", "value", "entropy", "clip_frac", "behaviour_weight", "approx_kl")
TERM_KEYS = (*LOSS_KEYS, "behaviour_weight_sq")
# ... and what the step's rows were: "stale" counts the valid rows older than the version trained
# (behaviour version < k: decoupled PPO's off-policy rows; 0 in sync and with mode.eta=0).
STAT_KEYS = (*TERM_KEYS, "stale")


class EmulatedLearner:
    """Same interface as torch_learner.TorchLearner; shards are never read (their rows are counted from
    the announcements), and every "weight" counts the optimizer steps: a reply's value (the emulated
    actor's fingerprint of the weights it holds) says which version answered it, and whether whole."""

    def __init__(self, cfg, spec, metrics, n_trainers: int, index: int):
        self.cfg, self.metrics, self.n, self.index = cfg, metrics, n_trainers, index
        self.dp_size, self.dp_index, self.collective, self.sharded_ckpts = n_trainers, index, False, False
        self.bad: set[str] = set()
        self.params = np.zeros(cfg.policy.emulated_params, np.float32)
        self.step_start = self.params.copy()   # what the current version number names (see weights)
        self.rows_per_s = cfg.policy.train_samples_per_s * cfg.algo.update_epochs

    def connect(self, transport, train_ranks) -> None:
        pass  # the step's cost is known from the plan: no collective needed to wait for the slowest

    def preload(self, name: str) -> None:
        pass

    def forget(self, names) -> None:
        pass

    def mark_lost(self, name: str, above: int) -> None:
        pass  # emulated rows carry no log-probs to correct

    def new_version(self) -> None:
        self.step_start = self.params.copy()

    def train(self, slices, version: int, opt_step: int = 1) -> np.ndarray:
        per_owner = Counter()
        for s in slices:
            per_owner[s.owner] += s.stop - s.start
        sleep_ms(max(per_owner.values(), default=0) / self.rows_per_s * 1000.0)
        self.params += 1.0
        return np.array([sum(per_owner.values())] + [0.0] * len(STAT_KEYS), np.float64)

    def weights(self) -> np.ndarray:
        """The weights of the current version: the parameters at its start (a mid-version resume
        has moved on from them, and publishing those under the same number would reuse it)."""
        sleep_ms(self.cfg.policy.weight_sync_ms)
        return self.step_start

    def digest(self) -> str:
        return hashlib.sha256(self.params.tobytes()).hexdigest()

    def state(self, mid_version: bool) -> dict:
        return {"params": self.params.copy(), **({"step_start": self.step_start.copy()} if mid_version else {})}

    def load_state(self, state: dict) -> None:
        self.params[:] = state["params"]
        self.step_start = state.get("step_start", self.params).copy()

    def save(self, state: dict, path: Path) -> None:
        """The parameters as an array, everything else (counters, ledger, plan state) as JSON."""
        arrays = {k: v for k, v in state.items() if k in ARRAY_KEYS}
        rest = {k: v for k, v in state.items() if k not in ARRAY_KEYS}
        with open(path, "wb") as f:
            np.savez(f, **arrays, rest=np.array(json.dumps(rest)))

    @staticmethod
    def load(path: Path) -> dict:
        with np.load(path, allow_pickle=False) as z:
            return {**{k: z[k].copy() for k in ARRAY_KEYS if k in z}, **json.loads(str(z["rest"]))}
