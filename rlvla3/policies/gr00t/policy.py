"""`gr00t`: GR00T N1.5 (model.py) as an RL policy, sampled as `pi0` is (Gaussian noise injected
at every denoising step, so the chain's log pi is exact; pi/pi0.py says why), in GR00T's own
time direction: from t = 0 (noise) up, mu_k = x_k + v(x_k, k/S) / S.

Random-initialised from `policy` sizes (the prompt: hashed words after the image tokens), or
`policy.pretrained`: a GR00T N1.5 folder (folder.py) with one embodiment's statistics in
experiment_cfg/metadata.json (min/max on state and actions) and Eagle 2.5's tokenizer
(policy.tokenizer). The action's `gripper` dims map to the env as GR00T's LIBERO client does
(1 - 2x: its data holds 1 open, 0 closed; the env -1 open, +1 closed).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..pi.pi0 import Pi0Flow
from . import layout
from .folder import load_folder, published_gr00t
from .model import DiTBlock, Gr00tConfig, Gr00tModel, VLBlock


def tiny_config(pcfg, spec) -> Gr00tConfig:
    d, heads = pcfg.d_model, pcfg.heads
    vision = dict(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=pcfg.layers, num_attention_heads=heads,
                  patch_size=pcfg.patch, image_size=spec.image_size)
    text = dict(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=pcfg.layers, num_attention_heads=heads,
                num_key_value_heads=1, head_dim=d // heads, vocab_size=pcfg.vocab, rope_theta=1e6)
    w = d // 2   # the DiT narrower than the features, as released (1536 against 2048)
    return Gr00tConfig(vision, text, action_horizon=spec.chunk, max_state_dim=spec.proprio_dim, max_action_dim=spec.action_dim,
                       hidden_size=d, input_embedding_dim=w, dit_layers=2 * pcfg.layers, dit_heads=heads, dit_head_dim=w // heads,
                       dit_output_dim=d, vl_layers=pcfg.layers, vl_heads=heads, vl_head_dim=d // heads, future_tokens=4,
                       max_seq_len=max(64, spec.chunk), num_inference_steps=pcfg.denoise_steps)


class Gr00tFlow(Pi0Flow):
    def __init__(self, pcfg, spec, published: bool = False):
        self.tag, self.entry = layout.metadata(pcfg.pretrained) if pcfg.pretrained and not published else (None, None)
        super().__init__(pcfg, spec, published)
        self.gripper = layout.gripper_dims(self.entry) if self.entry else []
        ids, self.image_token = layout.template(Path(pcfg.tokenizer or pcfg.pretrained), spec.cameras,
                                                self.model.config.tokens_per_image) if self.entry else ([], None)
        self.register_buffer("template", torch.tensor(ids, dtype=torch.long), persistent=False)

    def build(self, pcfg, spec):
        if pcfg.pretrained:
            return load_folder(Path(pcfg.pretrained), layout.EMBODIMENTS[self.tag])
        return Gr00tModel(tiny_config(pcfg, spec))

    def published(self):
        return published_gr00t(torch.get_default_device())

    def normaliser(self, pcfg, spec):
        identity = lambda d: (np.ones(d, np.float32), np.zeros(d, np.float32))  # noqa: E731
        if self.entry is None:
            return identity(spec.proprio_dim), identity(spec.action_dim)
        stats, source = self.entry["statistics"], f"{pcfg.pretrained}/experiment_cfg/metadata.json"
        return (layout.min_max_affine(stats["state"], spec.proprio_dim, "state", source),
                layout.min_max_affine(stats["action"], spec.action_dim, "action", source))

    def prefix_width(self) -> int:
        return self.model.config.text["hidden_size"]

    def _prefix(self, images, proprio, tokens):
        if self.template.numel():
            tokens = torch.cat([self.template.expand(tokens.shape[0], -1), tokens.long()], 1)
        f = self.model.features(images, tokens, self._state(proprio), self.image_token)
        m = f.valid[..., None].to(f.hidden.dtype)
        return f, f.valid, self.value_head((f.hidden * m).sum(1) / m.sum(1))[:, 0]

    def velocity(self, cache, mask, state, x, t):
        return self.model.velocity(cache, x, t)

    def step_velocity(self, cache, mask, state, x, t):
        return self.velocity(cache, mask, state, x, t)

    def direction(self, cache, mask, state, x, k):
        """u_k = dx/dtau (flow_rl's time, tau = 1 - k/S): GR00T integrates from noise (t = 0) to
        actions (t = 1), its velocity a - eps at t = k/S is -u."""
        t = torch.full((x.shape[0],), k / self.steps, dtype=torch.float32, device=x.device)
        xp = nn.functional.pad(x, (0, self.model.config.max_action_dim - self.action_dim))
        return -self.velocity(cache, mask, state, xp, t)[..., :self.action_dim]

    def bc_loss(self, images, proprio, tokens, sample, actions):
        """GR00T's flow-matching loss per sample [n] (SFT): t = (s - Beta(a, b)) / s,
        x_t = (1 - t) eps + t a, regress v(x_t, t) on a - eps."""
        f, _, _ = self._prefix(images, proprio, tokens)
        c = self.model.config
        scale, shift = (torch.as_tensor(v, device=actions.device) for v in self.action_affine)
        a = actions.float() * scale + shift
        n = a.shape[0]
        beta = torch.distributions.Beta(*c.noise_beta).sample((n,)).to(a.device)
        t = ((c.noise_s - beta) / c.noise_s).clamp(0.0, 1.0)
        eps = torch.randn_like(a)
        x_t = (1 - t[:, None, None]) * eps + t[:, None, None] * a
        pad = (0, c.max_action_dim - self.action_dim)
        v = self.model.velocity(f, nn.functional.pad(x_t, pad), t)[..., :self.action_dim]
        return ((v - (a - eps)) ** 2).mean((-1, -2))

    def expert_sample(self, sampling, actions: np.ndarray, bins: int) -> np.ndarray:
        actions = np.array(actions, np.float32)
        actions[..., self.gripper] = (1.0 - actions[..., self.gripper]) / 2.0   # env's -1/+1 -> GR00T's 1/0
        return super().expert_sample(sampling, actions, bins)

    def to_env_action(self, sample: np.ndarray) -> np.ndarray:
        scale, shift = self.action_affine
        out = (sample[:, -1] - shift) / scale
        out[..., self.gripper] = np.sign(1.0 - 2.0 * out[..., self.gripper])   # GR00T's LIBERO client
        return np.clip(out, -1.0, 1.0).astype(np.float32)

    def shard_units(self):
        return [*super().shard_units(), *(m for m in self.modules() if isinstance(m, (VLBlock, DiTBlock)))]
