"""`smolvla`: SmolVLA (model.py) as an RL policy, sampled as `pi0` is: Gaussian noise injected at
every denoising step, so the chain's log pi is exact (pi/pi0.py says why and what is learned).

What differs from π0 here is the model: the state is a token of the prefix (SmolVLA's
`state_proj`), so the denoising steps read the prefix's cached K/V alone and never extend it; V(s)
is a linear head on the mean of the VLM's normed last hidden states (valid positions).

Random-initialised from `policy` sizes, or `policy.pretrained`: a LeRobot SmolVLA folder
(folder.py), its normaliser (policy_{pre,post}processor.json and their statistics: MEAN_STD on
state and actions as smolvla_base declares) and SmolVLM2's tokenizer (policy.tokenizer).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..pi.pi0 import Pi0Flow
from .folder import load_folder, published_smolvla
from .model import SmolVLAModel, tiny_config


class SmolVLAFlow(Pi0Flow):
    # The VLM and expert layers are run part by part (model.py): none is entered through its
    # forward, so gradient checkpointing reaches the vision tower only.
    cache_writers = ("model.vlm_with_expert.vlm.model.text_model", "model.vlm_with_expert.lm_expert")

    def build(self, pcfg, spec):
        if pcfg.pretrained:
            return load_folder(Path(pcfg.pretrained))
        return SmolVLAModel(tiny_config(pcfg, spec))

    def published(self):
        return published_smolvla(torch.get_default_device())

    def prefix_width(self) -> int:
        return self.model.config.text.hidden_size

    def _prefix(self, images, proprio, tokens):
        prefix = self.model.prefix(images, tokens, self._state(proprio))
        m = prefix.valid[..., None].to(prefix.hidden.dtype)
        pooled = (prefix.hidden * m).sum(1) / m.sum(1)
        return prefix, prefix.valid, self.value_head(pooled)[:, 0]

    def velocity(self, cache, mask, state, x, t):
        return self.model.velocity(cache, x, t)   # the state is a token of the prefix

    def step_velocity(self, cache, mask, state, x, t):
        return self.velocity(cache, mask, state, x, t)   # the steps never extend the prefix's K/V

    def shard_units(self):
        """The vision tower's layers whole; of each VLM and expert layer, the parts model.py calls
        (the attention projections one by one, the MLP): a unit is gathered by its own forward."""
        vlm = self.model.vlm
        parts = []
        for layer in [*vlm.text_model.layers, *self.model.expert.layers]:
            a = layer.self_attn
            parts += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, layer.mlp]
        return [*vlm.vision_model.encoder.layers, *parts]
