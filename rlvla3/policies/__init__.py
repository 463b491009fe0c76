"""VLA policy families behind one interface (`base.Policy`), and the two halves each role uses:
an *actor* for the Generator (`act` on numpy batches, `load` of flat weights) and a *learner* for
the Trainer (`learner.TorchLearner`).

This file imports nothing heavy. The torch families are imported only when asked for; the
`emulated` family (`emulated.py`, numpy only) sleeps for the costs in `cfg.policy` instead of
computing, so many Generator and Trainer ranks run on few cores without torch.
"""
from __future__ import annotations


def make_policy(cfg, spec):
    """The torch policy of `cfg.policy` for observations/actions of `spec` (random init, seeded)."""
    if cfg.policy.name == "tiny":
        from .tiny import TinyVLA
        return TinyVLA(cfg.policy, spec)
    raise ValueError(f"policy.name={cfg.policy.name!r} has no torch model; use tiny")


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
