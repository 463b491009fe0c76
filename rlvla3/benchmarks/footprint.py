"""The Trainer's GPU memory for a family at its published size, measured on the meta device
(nothing is allocated, no weights are read): `python -m rlvla3.bench memory`.

- weights, gradients, Adam's two moments and the frozen copies the Trainer keeps (π_prox, and
  the KL reference) come from the real parameters' counts and dtypes (trainable ones are
  float32; a LoRA base is in policy.lora_base_dtype and is shared by the copies);
- activations are the bytes autograd keeps for the backward pass of one micro-batch of
  `evaluate` (the Trainer's forward), recorded by a saved-tensors hook over the family's real
  forward at the published size. Attention (SDPA in every family) is counted as a GPU's fused
  kernels keep it: q, k, v, the output, the mask and one log-sum-exp per query and head, not
  the [q, k] probabilities the meta device's composite implementation would keep. Each
  transformer layer's share is recorded too, so the same
  pass also gives the figure under policy.grad_checkpointing: a checkpointed layer keeps only
  its input hidden state, and the backward replays one layer at a time (its share comes back
  once, at the peak).

Not counted: the allocator's fragmentation, cuBLAS/attention workspaces and the transient
buffers of the backward pass itself (plan a margin of ~10%).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from ..policies.base import zero_batch

GB = 1e9


@dataclass
class Footprint:
    trainable: int          # parameters with gradients and Adam state
    frozen: int             # parameters without (a LoRA base)
    weights: float          # bytes, all parameters in their dtypes
    grads: float            # float32 gradient of every trainable parameter
    adam: float             # Adam's two float32 moments per trainable parameter
    copies: float           # π_prox / reference copies of the trainable parameters
    activations: float      # bytes kept for backward, one micro-batch, no checkpointing
    activations_ckpt: float  # the same under policy.grad_checkpointing

    def total(self, checkpointing: bool) -> float:
        act = self.activations_ckpt if checkpointing else self.activations
        return self.weights + self.grads + self.adam + self.copies + act


def published_policy(cfg, spec):
    """The family of `cfg` at its published configuration on the meta device, with cfg's LoRA
    but no checkpointing wrappers (the measurement accounts for them), in training mode."""
    from ..policies import make_policy

    plain = dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, grad_checkpointing=False))
    with torch.device("meta"):
        policy = make_policy(plain, spec, published=True)
    return policy.to("meta").train()


def footprint_of(policy, spec, micro_batch: int, copies: int) -> Footprint:
    """The footprint of training `policy` (built without checkpointing wrappers, on whatever
    device) on micro-batches of `micro_batch` rows, with `copies` frozen copies of the trainable
    weights (π_prox: 1 in async mode or for V-trace; +1 with a KL reference)."""
    from ..policies import checkpointed_layers

    params = list(policy.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    per_layer, inputs, outside = _saved_bytes(policy, checkpointed_layers(policy), spec, micro_batch)
    return Footprint(
        trainable=trainable, frozen=sum(p.numel() for p in params) - trainable,
        weights=float(sum(p.numel() * p.element_size() for p in params)),
        grads=4.0 * trainable, adam=8.0 * trainable, copies=4.0 * trainable * copies,
        activations=outside + sum(per_layer.values()),
        activations_ckpt=outside + sum(inputs.values()) + max(per_layer.values(), default=0.0))


class _SDPA(torch.autograd.Function):
    """Shapes only: what a fused attention kernel (flash / memory-efficient) saves for backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask):
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(*(t for t in (q, k, v, out, lse, mask) if t is not None))
        return out


def _matmuls() -> frozenset:
    F = torch.nn.functional
    return frozenset({F.linear, F.conv2d, F.scaled_dot_product_attention, torch.matmul, torch.mm, torch.bmm,
                      torch.addmm, torch.baddbmm, torch.einsum, torch.Tensor.matmul, torch.Tensor.__matmul__})


class GpuKernels(torch.overrides.TorchFunctionMode):
    """What the meta device does not do as a GPU does: attention as fused kernels keep it, and,
    given `autocast_dtype`, autocast's cast of the inputs of matmuls, convolutions and attention
    (autocast does not run on the meta device, where mixed dtypes silently promote)."""

    def __init__(self, autocast_dtype: torch.dtype | None = None):
        super().__init__()
        self.dtype, self.matmuls = autocast_dtype, _matmuls()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.dtype is not None and func in self.matmuls:
            cast = lambda t: t.to(self.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t  # noqa: E731
            args, kwargs = torch.utils._pytree.tree_map(cast, (args, kwargs))
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v, *rest = args
            return _SDPA.apply(q, k, v, rest[0] if rest else kwargs.get("attn_mask"))
        return func(*args, **kwargs)


def identity(t: torch.Tensor) -> int:
    """What makes two tensors the same memory: the storage off the meta device (which has none:
    there the tensor object itself)."""
    return id(t) if t.is_meta else t.untyped_storage().data_ptr()


def _saved_bytes(policy, layers, spec, n: int, autocast_dtype: torch.dtype | None = None,
                 ) -> tuple[dict[str, float], dict[str, float], float]:
    """Bytes saved for backward by `policy.evaluate` on n rows (under autocast to `autocast_dtype`,
    when given): per layer of `layers` (name -> module), each layer's input hidden state, and the rest. A tensor is counted once (views
    count as their base; off the meta device, tensors sharing a storage once), parameters not at all."""
    params = {identity(p) for p in policy.parameters()}
    seen: dict[int, torch.Tensor] = {}   # holds what it saw: a freed tensor's id could come back
    per_layer = {name: 0.0 for name, _ in layers}
    inputs = dict(per_layer)
    current: list[str] = []
    outside = 0.0

    def pack(t):
        nonlocal outside
        base = t._base if t._base is not None else t
        key = identity(base)
        if key not in params and key not in seen:
            seen[key] = base
            size = float(base.numel() * base.element_size())
            if current:
                per_layer[current[-1]] += size
            else:
                outside += size
        return t

    def enter(name):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            inputs[name] += float(x.numel() * x.element_size())
            current.append(name)
        return hook

    def leave(module, args, output):
        current.pop()   # returns None: the output stands

    handles = [m.register_forward_pre_hook(enter(name), with_kwargs=True) for name, m in layers]
    handles += [m.register_forward_hook(leave) for _, m in layers]
    try:
        with no_value_checks(), GpuKernels(autocast_dtype), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            # The loss on evaluate's [n]-sized outputs saves next to nothing more.
            policy.evaluate(*zero_batch(spec, n, next(policy.parameters()).device))
    finally:
        for h in handles:
            h.remove()
    return per_layer, inputs, outside


@contextlib.contextmanager
def no_value_checks():
    """Switch off the checks on the forward path that read a tensor's values (meta tensors have
    none): torch.distributions' argument validation, and transformers' tests of whether an
    all-ones padding mask lets SDPA skip the causal mask (taken as "no": the mask is then
    materialised, [n, 1, S, S] booleans, an upper bound) or the bidirectional one (the same when
    a padding mask is given, e.g. SmolVLM's vision tower's all-ones one; without one the test
    reads no value and runs as it is)."""
    from transformers import masking_utils

    validate = torch.distributions.Distribution._validate_args
    skips = {name: getattr(masking_utils, name) for name in ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")}
    torch.distributions.Distribution.set_default_validate_args(False)
    masking_utils._ignore_causal_mask_sdpa = lambda *args, **kwargs: False
    bidirectional = skips["_ignore_bidirectional_mask_sdpa"]
    masking_utils._ignore_bidirectional_mask_sdpa = \
        lambda padding_mask, *args, **kwargs: padding_mask is None and bidirectional(padding_mask, *args, **kwargs)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)
        for name, skip in skips.items():
            setattr(masking_utils, name, skip)


def fitted(cfg, spec, copies: int) -> tuple[Footprint, float]:
    """The footprint of `cfg.policy` at its published size at micro-batch 1, and the activation
    bytes each further row adds (under the configured checkpointing): activations grow linearly
    with the micro-batch."""
    policy = published_policy(cfg, spec)
    one, two = footprint_of(policy, spec, 1, copies), footprint_of(policy, spec, 2, copies)
    ckpt = cfg.policy.grad_checkpointing
    return one, two.total(ckpt) - one.total(ckpt)


def largest_micro_batch(one: Footprint, per_row: float, checkpointing: bool, capacity: float,
                        margin: float = 0.1) -> int:
    """The largest micro-batch whose footprint stays within (1 - margin) of `capacity` bytes."""
    return max(0, int(((1 - margin) * capacity - one.total(checkpointing)) // per_row) + 1)


@dataclass
class ShardedFootprint:
    """One Trainer rank's GPU memory under policy.data_parallel=fsdp with compute_dtype=bfloat16,
    over any number of ranks (engine/fsdp.py):

    - sharded over the ranks: every weight in its dtype (float32 masters of what trains, the
      frozen base in policy.lora_base_dtype), float32 gradients and Adam's moments of what trains,
      π_prox (a float32 copy of what trains: engine/fsdp.ProxShards) and a KL reference (a whole
      policy, base included);
    - gathered in bf16, whole on every rank: the root's parameters for the whole forward (what no
      transformer layer holds) and two layers at a time (the one running, the next one
      prefetched), with the running layer's gradient in bf16 and float32 before its reduction;
    - activations of the forward under autocast to bf16;
    - once per optimizer step, before the micro-batches: the policy gathered whole in bf16 with
      π_prox's values, for the forwards of loading the step's rows (only with a π_prox copy).
    """

    trainable: int
    frozen: int
    sharded: float           # bytes, divided over the ranks
    gathered: float          # bytes whole on every rank during the micro-batches
    prox_whole: float        # bytes whole on every rank while the step's rows load
    activations: float       # micro-batch 1, bf16, under the configured checkpointing
    per_row: float           # each further row
    ckpt: float              # a checkpoint's bytes: what trains and its Adam state, never the frozen base

    def peak(self, gpus: int, micro_batch: int) -> float:
        train = self.gathered + self.activations + (micro_batch - 1) * self.per_row
        return self.sharded / gpus + max(train, self.prox_whole)

    def largest_micro_batch(self, gpus: int, capacity: float, margin: float = 0.1) -> int:
        room = (1 - margin) * capacity - self.sharded / gpus
        if room < self.prox_whole or room < self.gathered + self.activations:
            return 0
        return int((room - self.gathered - self.activations) // self.per_row) + 1


def sharded_footprint(cfg, spec, copies: int) -> ShardedFootprint:
    """ShardedFootprint of `cfg.policy` at its published size, measured on the meta device."""
    policy = published_policy(cfg, spec)
    params = list(policy.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    weights = float(sum(p.numel() * p.element_size() for p in params))
    units = [sum(p.numel() for p in u.parameters()) for u in policy.shard_units()]
    root, largest = total - sum(units), max(units, default=0)
    frozen = {id(p) for p in params if not p.requires_grad}
    kept = float(sum(v.numel() * v.element_size() for v in policy.state_dict(keep_vars=True).values() if id(v) not in frozen))
    ckpt = kept + 8.0 * trainable   # the model part and Adam's two float32 moments
    from ..policies import checkpointed_layers

    layers = checkpointed_layers(policy)
    policy = policy.to(torch.bfloat16)   # FSDP's gathered parameters
    act = []
    for n in (1, 2):
        per_layer, inputs, outside = _saved_bytes(policy, layers, spec, n, torch.bfloat16)
        whole = outside + sum(per_layer.values())
        act.append(outside + sum(inputs.values()) + max(per_layer.values(), default=0.0)
                   if cfg.policy.grad_checkpointing else whole)
    return ShardedFootprint(
        trainable=trainable, frozen=total - trainable,
        sharded=weights + 12.0 * trainable + 4.0 * trainable * min(copies, 1) + max(copies - 1, 0) * weights,
        gathered=2.0 * (root + 2 * largest) + 6.0 * largest,
        prox_whole=2.0 * total if copies else 0.0,
        activations=act[0], per_row=act[1] - act[0], ckpt=ckpt)
