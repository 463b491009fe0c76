"""LoRA (Hu et al. 2021, arXiv 2106.09685): train a rank-r update (alpha / r) * B A of each
frozen linear weight W of the pretrained backbone, plus the family's own heads in full.

This is what fits a 7 B VLA's Trainer on one GPU (OpenVLA's and OpenVLA-OFT's own fine-tuning
recipes, RLinf's OpenVLA-OFT RL: rank 32 on every linear layer of the backbone): the base is
frozen and kept in `policy.lora_base_dtype` (2 bytes per parameter in bfloat16), and only the
adapters and heads have gradients and Adam state. Generators build the same model, so a weight
publish carries the trainable parameters only.

Names follow peft's layout (`<linear>.base_layer.weight`, `<linear>.lora_A.weight` [r, in],
`<linear>.lora_B.weight` [out, r]); B starts at zero, so the adapted model starts as the
pretrained one.
"""
from __future__ import annotations

import math

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Output projections onto a vocabulary stay frozen and unadapted (peft's "all-linear" rule).
SKIPPED = ("lm_head",)


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, base_dtype: torch.dtype):
        super().__init__()
        self.base_layer = base.to(base_dtype).requires_grad_(False)
        device = base.weight.device
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=device)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=device)
        if device.type != "meta":
            nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))   # peft's init: A random, B zero
            nn.init.zeros_(self.lora_B.weight)
        self.scale = alpha / rank

    @property
    def weight(self) -> torch.Tensor:
        """The frozen base weight (modules that read `.weight` of a linear see the pretrained one)."""
        return self.base_layer.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.base_layer.weight
        y = self.base_layer(x.to(w.dtype)).to(x.dtype)
        return y + self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))).to(x.dtype) * self.scale


def apply_lora(policy: nn.Module, rank: int, alpha: float, base_dtype: str) -> None:
    """Freeze `policy` except its top-level parameters and the modules it names in
    `fully_trained`, and wrap every other nn.Linear (but those in SKIPPED) with an adapter."""
    full = set(getattr(policy, "fully_trained", ()))
    policy.requires_grad_(False)
    for name, child in policy.named_children():
        if name in full:
            child.requires_grad_(True)
        else:
            wrap_linears(child, rank, alpha, DTYPES[base_dtype])
    for p in policy._parameters.values():
        if p is not None:
            p.requires_grad_(True)


def wrap_linears(module: nn.Module, rank: int, alpha: float, dtype: torch.dtype) -> None:
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear and name not in SKIPPED:
            setattr(module, name, LoRALinear(child, rank, alpha, dtype))
        elif not isinstance(child, LoRALinear):
            wrap_linears(child, rank, alpha, dtype)


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """The parameters the Trainer optimizes and publishes (all of them without LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]
