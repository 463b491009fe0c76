"""VLA policy families behind one interface (`base.Policy`), and the *actor* a Generator runs
(`act` on numpy batches, `load` of flat weights). The Trainer's half, the learner, is the
engine's (`engine/learners.py`): it trains a policy `make_policy` builds.

This file imports nothing heavy. The torch families are imported only when asked for; the
`emulated` family (`emulated.py`, numpy only) sleeps for the costs in `cfg.policy` instead of
computing, so many Generator ranks run on few cores without torch.
"""
from __future__ import annotations

from .sampling import CHAIN_FAMILIES, SampleLayout, sample_layout, tokens_to_actions

__all__ = ["CHAIN_FAMILIES", "SampleLayout", "make_actor", "make_policy", "sample_layout", "tokens_to_actions"]


def make_policy(cfg, spec):
    """The torch policy of `cfg.policy` for observations/actions of `spec` (random init, seeded,
    or `policy.pretrained`)."""
    name = cfg.policy.name
    if name == "tiny":
        from .tiny import TinyVLA
        return TinyVLA(cfg.policy, spec)
    if name == "openvla" and cfg.policy.pretrained:
        from .openvla_released import ReleasedOpenVLA
        return ReleasedOpenVLA(cfg.policy, spec)
    if name == "openvla":
        from .openvla import OpenVLA
        return OpenVLA(cfg.policy, spec)
    if name == "openvla_oft":
        from .openvla_oft import ReleasedOFT
        return ReleasedOFT(cfg.policy, spec)
    if name == "pi0":
        from .pi0 import Pi0Flow
        return Pi0Flow(cfg.policy, spec)
    if name == "pi05":
        from .pi05 import Pi05Flow
        return Pi05Flow(cfg.policy, spec)
    raise ValueError(f"policy.name={name!r} has no torch model; use tiny, openvla, openvla_oft, pi0 or pi05")


def make_actor(cfg, spec):
    """What a Generator runs: the policy's forward, or the emulated cost of one."""
    if cfg.policy.name == "emulated":
        from .emulated import EmulatedActor
        return EmulatedActor(cfg.policy, spec)
    from .base import TorchActor
    return TorchActor(make_policy(cfg, spec), cfg.policy.device)

