"""VLA policy families behind one interface (`base.Policy`), and the two halves each role uses:
an *actor* for the Generator (`act` on numpy batches, `load` of flat weights) and a *learner* for
the Trainer (`learner.TorchLearner`).

This file imports nothing heavy. The torch families are imported only when asked for; the
`emulated` family (`emulated.py`, numpy only) sleeps for the costs in `cfg.policy` instead of
computing, so many Generator and Trainer ranks run on few cores without torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Families whose action is a flow-matching denoising chain; every other family samples tokens.
CHAIN_FAMILIES = ("pi0",)


@dataclass(frozen=True)
class SampleLayout:
    """What one forward samples per observation, i.e. what a shard must keep for the Trainer to
    recompute log pi(sample | obs) (shards.py documents the arrays):
    - token families (tiny, openvla, emulated): action token ids int32 [K*D] (chunk-major), drawn
      by Gumbel-max from uniform noise [K*D, bins];
    - chain families (pi0): the denoising chain float32 [S+1, K, D] (x_0 = initial noise, x_S =
      the executed chunk), drawn from standard-normal noise of the same shape.
    A Generator draws the noise per request (seeded), so a sample never depends on its batch."""

    chunk: int
    action_dim: int
    shape: tuple[int, ...]
    dtype: str
    noise_shape: tuple[int, ...]
    noise: str            # uniform | normal


def sample_layout(pcfg, action_dim: int) -> SampleLayout:
    k = pcfg.chunk
    if pcfg.name in CHAIN_FAMILIES:
        shape = (pcfg.denoise_steps + 1, k, action_dim)
        return SampleLayout(k, action_dim, shape, "float32", shape, "normal")
    return SampleLayout(k, action_dim, (k * action_dim,), "int32", (k * action_dim, pcfg.action_bins), "uniform")


def tokens_to_actions(tokens: np.ndarray, bins: int, chunk: int, action_dim: int) -> np.ndarray:
    """Action token ids [n, K*D] -> env action chunks [n, K, D]: bin b -> 2b/(bins-1) - 1."""
    return (tokens.astype(np.float32) / (bins - 1) * 2.0 - 1.0).reshape(-1, chunk, action_dim)


def make_policy(cfg, spec):
    """The torch policy of `cfg.policy` for observations/actions of `spec` (random init, seeded,
    or `policy.pretrained`)."""
    name = cfg.policy.name
    if name == "tiny":
        from .tiny import TinyVLA
        return TinyVLA(cfg.policy, spec)
    if name == "openvla":
        from .openvla import OpenVLA
        return OpenVLA(cfg.policy, spec)
    if name == "pi0":
        from .pi0 import Pi0Flow
        return Pi0Flow(cfg.policy, spec)
    raise ValueError(f"policy.name={name!r} has no torch model; use tiny, openvla or pi0")


def make_actor(cfg, spec):
    """What a Generator runs: the policy's forward, or the emulated cost of one."""
    if cfg.policy.name == "emulated":
        from .emulated import EmulatedActor
        return EmulatedActor(cfg.policy, spec)
    from .base import TorchActor
    return TorchActor(make_policy(cfg, spec), cfg.policy.device)


def make_learner(cfg, spec, metrics, n_trainers: int, index: int, shards_dir):
    """What a Trainer runs: loss, backward and optimizer (learner.py), or their emulated cost."""
    if cfg.policy.name == "emulated":
        from .emulated import EmulatedLearner
        return EmulatedLearner(cfg, spec, metrics, n_trainers, index)
    from ..learner import TorchLearner
    return TorchLearner(cfg, spec, metrics, n_trainers, index, shards_dir)
