"""`emulated`: a policy whose Generator forward costs what `cfg.policy` says, spent sleeping (its
Trainer half is `engine/learners.py: EmulatedLearner`). numpy only: emulated ranks import neither
torch nor a simulator.

With `env=emulated` too, the real engine (MPI, batching, credits, shards, plans, versions,
checkpoints) runs with the costs of a planner profile (`python -m rlvla3.plan validate`: `planner/overrides.py:
emulation_overrides` turns a profile into these fields), many ranks
on few cores. This is how the planner's models are checked against the engine.

Costs (the planner's Profile, rlvla3/planner/profile.py):
- forward of a batch of n samples: infer_fixed_ms + infer_per_sample_ms * n;
- optimizer step: every Trainer trains its own rows at train_samples_per_s / update_epochs rows/s
  (the profile's rate counts a rollout sample once over all epochs) and the data-parallel step
  ends when the slowest Trainer is done, so each Trainer sleeps for the largest share;
- publishing a version: weight_sync_ms on the Trainer, plus the real transfer of
  `emulated_params` float32 values to every Generator.
Actions are uniform random tokens (Gumbel-max on the Generator's noise with flat logits).
"""
from __future__ import annotations

import math
import time

import numpy as np

from .sampling import tokens_to_actions


def sleep_ms(ms: float) -> None:
    """Spend an emulated cost (the actor's forward here, the learner's step in engine/learners.py)."""
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
        sleep_ms(self.c.infer_fixed_ms + self.c.infer_per_sample_ms * n)
        tok = noise.argmax(-1)  # flat logits: Gumbel-max picks the largest uniform
        logp = np.full(n, -tok.shape[1] * math.log(self.c.action_bins), np.float32)
        return tok.astype(np.int32), logp, np.full(n, self.fingerprint(), np.float32)

    def fingerprint(self) -> float:
        """The value of every reply: the mean of the first and the last weight. The emulated
        Trainer's weights all count its optimizer steps, so a whole version gives that count and
        a model updated only in part (buckets land first to last) a value between two counts."""
        return float(self.weights[0] + self.weights[-1]) / 2 if self.n_params else 0.0

    def to_env_action(self, action_tokens: np.ndarray) -> np.ndarray:
        return tokens_to_actions(action_tokens, self.c.action_bins, self.spec.chunk, self.spec.action_dim)
