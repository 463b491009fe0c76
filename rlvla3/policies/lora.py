"""LoRA (Hu et al. 2021, arXiv 2106.09685) through peft: train a rank-r update (alpha / r) B A of
each frozen linear weight W of the pretrained backbone, plus the family's own heads in full.

This is what fits a 7 B VLA's Trainer on one GPU (OpenVLA's and OpenVLA-OFT's own fine-tuning
recipes, RLinf's OpenVLA-OFT RL: rank 32 on every linear layer of the backbone): the base is
frozen and kept in `policy.lora_base_dtype` (2 bytes per parameter in bfloat16), and only the
adapters and heads have gradients and Adam state. Generators build the same model, so a weight
publish carries the trainable parameters only.

peft's own layers (`peft.tuners.lora.Linear`, injected with `inject_adapter_in_model`), so the
names are peft's (`<linear>.base_layer.weight`, `<linear>.lora_A.default.weight` [r, in],
`<linear>.lora_B.default.weight` [out, r]); B starts at zero, so the adapted model starts as the pretrained one. The adapters stay float32
beside a bfloat16 base (a bf16 Adam update would round most of a step away).

Generators serve merged weights (W + (alpha / r) B A, one matmul per linear instead of three) when
the base is float32: `ServedAdapters` merges once per version as it lands, taking the previous
version's update out first. A bfloat16 base is served unmerged: each merge and unmerge rounds W to
bf16's grid (steps of 1/256 to 1/128 of |W|), so the base drifts version after version (50
merge/unmerge cycles of a 1%-size update moved a bf16 base by 0.24% of its norm, a float32 one
by 4e-8: tests/policies/test_memory.py), and an update below half a step of its weight is lost.
"""
from __future__ import annotations

import re
import sys

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Output projections onto a vocabulary stay frozen and unadapted (peft's "all-linear" rule).
SKIPPED = ("lm_head",)
ADAPTER = "default"   # peft's adapter name: one adapter per model
PRE_PEFT = re.compile(r"\.lora_([AB])\.weight$")


def peft_names(model: dict) -> dict:
    """A checkpoint's weights under peft's adapter names. Checkpoints written before LoRA went
    through peft named an adapter `<linear>.lora_A.weight`, peft names it
    `<linear>.lora_A.default.weight`; the tensors, the base's names (`<linear>.base_layer.weight`)
    and the order of what trains (hence the optimizer state) are the same."""
    return {PRE_PEFT.sub(rf".lora_\1.{ADAPTER}.weight", k): v for k, v in model.items()}


class BaseLinear(nn.Linear):
    """A frozen base linear kept in another dtype than the activations (a bfloat16 base in a
    float32 model): the input is cast to the weight's dtype and the output back, as the rest of
    the model expects. A plain nn.Linear to peft and to state dicts (same names)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def apply_lora(policy: nn.Module, rank: int, alpha: float, base_dtype: str) -> None:
    """Freeze `policy` except its top-level parameters and the modules it names in
    `fully_trained`, and give every other nn.Linear below its top level (but those in SKIPPED)
    a peft LoRA adapter."""
    from peft import LoraConfig, inject_adapter_in_model

    full = set(getattr(policy, "fully_trained", ()))
    targets = [name for name, m in policy.named_modules()
               if type(m) is nn.Linear and "." in name and name.split(".")[0] not in full
               and name.rsplit(".", 1)[-1] not in SKIPPED]
    dtype = DTYPES[base_dtype]
    for name in targets:
        _as_base(policy, name, dtype)
    # The exact module names: peft matches a list entry against each name and its dotted tails.
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    meta = next(policy.parameters()).device.type == "meta"
    inject_adapter_in_model(config, policy, adapter_name=ADAPTER, low_cpu_mem_usage=meta)
    policy.requires_grad_(False)
    for name, child in policy.named_children():
        if name in full:
            child.requires_grad_(True)
    for p in policy._parameters.values():
        if p is not None:
            p.requires_grad_(True)
    for layer in adapters(policy):
        for p in (*layer.lora_A[ADAPTER].parameters(), *layer.lora_B[ADAPTER].parameters()):
            p.data = p.data.float()   # peft makes them in the base's dtype
            p.requires_grad_(True)


def _as_base(policy: nn.Module, name: str, dtype: torch.dtype) -> None:
    """Replace the linear `name` by a BaseLinear holding its weights in `dtype`, frozen."""
    parent, _, leaf = name.rpartition(".")
    old = policy.get_submodule(name)
    new = BaseLinear(old.in_features, old.out_features, bias=old.bias is not None, device="meta")
    new.weight = nn.Parameter(old.weight.detach().to(dtype), requires_grad=False)
    if old.bias is not None:
        new.bias = nn.Parameter(old.bias.detach().to(dtype), requires_grad=False)
    setattr(policy.get_submodule(parent), leaf, new)


def adapters(model: nn.Module) -> list:
    """The peft LoRA layers of `model` (none without importing peft where it was never loaded:
    a model without LoRA does not pay its import)."""
    if "peft" not in sys.modules:
        return []
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


class ServedAdapters:
    """A Generator's adapters merged into their float32 base weights (the module's docstring says
    why not bfloat16 ones): `unmerge()` takes the current version's update out of each base
    weight before a new version's adapters are written, `merge()` puts the new one in, so every
    forward between runs one matmul per linear."""

    def __init__(self, model: nn.Module):
        self.layers = [m for m in adapters(model) if m.get_base_layer().weight.dtype == torch.float32]

    def unmerge(self) -> None:
        for m in self.layers:
            if m.merged:
                m.unmerge()

    def merge(self) -> None:
        for m in self.layers:
            m.merge(adapter_names=[ADAPTER])


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the Trainer optimizes and publishes (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]
