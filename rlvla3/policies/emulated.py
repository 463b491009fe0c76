"""`emulated`: a policy whose Generator forward and Trainer step cost what `cfg.policy` says,
spent sleeping. numpy only: emulated ranks import neither torch nor a simulator.

With `env=emulated` too, the real engine (MPI, batching, credits, shards, plans, versions,
checkpoints) runs with the costs of a planner profile (`python -m rlvla3.plan emulate`), many ranks
on few cores. This is how the planner's models are checked against the engine.

Costs (the planner's Profile, rlvla3/planner.py):
- forward of a batch of n samples: infer_fixed_ms + infer_per_sample_ms * n;
- optimizer step: every Trainer trains its own rows at train_samples_per_s / update_epochs rows/s
  (the profile's rate counts a rollout sample once over all epochs) and the data-parallel step
  ends when the slowest Trainer is done, so each Trainer sleeps for the largest share;
- publishing a version: weight_sync_ms on the Trainer, plus the real transfer of
  `emulated_params` float32 values to every Generator.
Actions are uniform random tokens (Gumbel-max on the Generator's noise with flat logits).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np

from . import tokens_to_actions


def _sleep_ms(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1000.0)


class EmulatedActor:
    def __init__(self, pcfg, spec):
        self.c, self.spec = pcfg, spec
        self.n_params = pcfg.emulated_params
        self.weights = np.zeros(self.n_params, np.float32)

    def load(self, flat: np.ndarray) -> None:
        self.weights[:] = flat

    def act(self, obs: dict[str, np.ndarray], noise: np.ndarray):
        n = obs["proprio"].shape[0]
        _sleep_ms(self.c.infer_fixed_ms + self.c.infer_per_sample_ms * n)
        tok = noise.argmax(-1)  # flat logits: Gumbel-max picks the largest uniform
        logp = np.full(n, -tok.shape[1] * math.log(self.c.action_bins), np.float32)
        return tok.astype(np.int32), logp, np.zeros(n, np.float32)

    def to_env_action(self, action_tokens: np.ndarray) -> np.ndarray:
        return tokens_to_actions(action_tokens, self.c.action_bins, self.spec.chunk, self.spec.action_dim)


class EmulatedLearner:
    """Same interface as learner.TorchLearner; shards are never read (their rows are counted from
    the announcements), and the "weights" are a counter of optimizer steps."""

    def __init__(self, cfg, spec, metrics, n_trainers: int, index: int):
        self.cfg, self.metrics, self.n, self.index = cfg, metrics, n_trainers, index
        self.dp_size, self.dp_index, self.collective = n_trainers, index, False
        self.bad: set[str] = set()
        self.params = np.zeros(cfg.policy.emulated_params, np.float32)
        self.rows_per_s = cfg.policy.train_samples_per_s * cfg.algo.update_epochs

    def connect(self, transport, train_ranks) -> None:
        pass  # the step's cost is known from the plan: no collective needed to wait for the slowest

    def preload(self, name: str) -> None:
        pass

    def forget(self, names) -> None:
        pass

    def new_version(self) -> None:
        pass

    def train(self, slices, version: int, opt_step: int = 1) -> np.ndarray:
        from ..trainer import LOSS_KEYS

        per_owner = Counter()
        for s in slices:
            per_owner[s.owner] += s.stop - s.start
        _sleep_ms(max(per_owner.values(), default=0) / self.rows_per_s * 1000.0)
        self.params[0] += 1.0
        return np.array([sum(per_owner.values())] + [0.0] * len(LOSS_KEYS), np.float64)

    def weights(self) -> np.ndarray:
        _sleep_ms(self.cfg.policy.weight_sync_ms)
        return self.params

    def digest(self) -> str:
        return hashlib.sha256(self.params.tobytes()).hexdigest()

    def state(self, mid_version: bool) -> dict:
        return {"params": self.params.copy()}

    def load_state(self, state: dict) -> None:
        self.params[:] = state["params"]

    def save(self, state: dict, path: Path) -> None:
        """The parameters as an array, everything else (counters, ledger, plan state) as JSON."""
        rest = {k: v for k, v in state.items() if k != "params"}
        with open(path, "wb") as f:
            np.savez(f, params=state["params"], rest=np.array(json.dumps(rest)))

    @staticmethod
    def load(path: Path) -> dict:
        with np.load(path, allow_pickle=False) as z:
            return {"params": z["params"].copy(), **json.loads(str(z["rest"]))}
