"""VLA policy families behind one interface (`base.Policy`), and the *actor* a Generator runs
(`act` on numpy batches, `load` of flat weights). The Trainer's half, the learner, is the
engine's (`engine/learners.py`): it trains a policy `make_policy` builds.

This file imports nothing heavy. The torch families are imported only when asked for; the
`emulated` family (`emulated.py`, numpy only) sleeps for the costs in `cfg.policy` instead of
computing, so many Generator ranks run on few cores without torch.
"""
from __future__ import annotations

from .sampling import CHAIN_FAMILIES, SampleLayout, sample_layout, tokens_to_actions

__all__ = ["CHAIN_FAMILIES", "SampleLayout", "execute_steps", "make_actor", "make_policy", "sample_layout", "tokens_to_actions"]


def execute_steps(pcfg) -> int:
    """Env steps each action chunk executes: policy.execute_steps, or (0) what the released
    folder says (registry.Family.horizon), or the whole chunk."""
    import importlib

    from .registry import FAMILIES

    if pcfg.execute_steps:
        return pcfg.execute_steps
    f = FAMILIES.get(pcfg.name)
    if f and f.horizon and pcfg.pretrained:
        module, name = f.horizon.split(":")
        said = getattr(importlib.import_module(f".{module}", __name__), name)(pcfg.pretrained)
        if said:
            return said
    return pcfg.chunk


def make_policy(cfg, spec, published: bool = False):
    """The torch policy of `cfg.policy` for observations/actions of `spec` (random init, seeded,
    or `policy.pretrained`), with its LoRA adapters and gradient checkpointing as configured.
    published: the family's published configuration instead, random, reading no folder, on the
    default device (under `torch.device("meta")`: benchmarks/footprint.py; on a GPU: `bench
    families --size published`)."""
    policy = family(cfg, spec, published)
    p = cfg.policy
    fine_tuning = bool(p.pretrained or published)   # a random-init model trains in full, keeping its activations
    if p.lora_rank and fine_tuning:
        from .lora import apply_lora
        apply_lora(policy, p.lora_rank, p.lora_alpha, p.lora_base_dtype)
    if p.grad_checkpointing and fine_tuning:
        checkpoint_layers(policy)
    return policy


def checkpoint_layers(policy) -> None:
    """transformers' gradient checkpointing on the transformer layers of `policy`: each one is
    recomputed in backward (in training mode, with gradients on; `act` is unchanged). Layers
    under the family's `cache_writers` are left out: they fill a KV cache during the Trainer's
    forward, which transformers turns off under checkpointing (a replay would write it twice)."""
    from functools import partial

    import torch.utils.checkpoint

    for _, m in checkpointed_layers(policy):
        m.gradient_checkpointing = True
        m._gradient_checkpointing_func = partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)


def checkpointed_layers(policy) -> list:
    """(name, module) of the layers policy.grad_checkpointing recomputes."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [(name, m) for name, m in policy.named_modules()
            if isinstance(m, GradientCheckpointingLayer) and not name.startswith(tuple(policy.cache_writers))]


def family(cfg, spec, published: bool = False):
    """The family's model as built or loaded: the class `registry.FAMILIES` names for random init,
    or for a released folder (`policy.pretrained`) and the published size."""
    import importlib

    from .registry import FAMILIES, PUBLISHED

    name = cfg.policy.name
    if published and name not in PUBLISHED:
        raise ValueError(f"policy.name={name!r} has no published configuration ({', '.join(PUBLISHED)} do)")
    f = FAMILIES.get(name)
    released = bool(cfg.policy.pretrained or published)
    where = f and (f.released if released and f.released else f.model)
    if not where or not f.torch:
        raise ValueError(f"policy.name={name!r} has no torch model; use one of "
                         f"{', '.join(n for n, g in FAMILIES.items() if g.torch)}")
    module, cls = where.split(":")
    build = getattr(importlib.import_module(f".{module}", __name__), cls)
    return build(cfg.policy, spec, published) if f.released and released else build(cfg.policy, spec)


def make_actor(cfg, spec):
    """What a Generator runs: the policy's forward, or the emulated cost of one."""
    if cfg.policy.name == "emulated":
        from .emulated import EmulatedActor
        return EmulatedActor(cfg.policy, spec)
    from .base import TorchActor
    return TorchActor(make_policy(cfg, spec), cfg.policy.device)

