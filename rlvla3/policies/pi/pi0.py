"""`pi0`: a π0-style flow-matching VLA (transformers' `PI0ForConditionalGeneration`: PaliGemma
prefix, Gemma action expert attending to the prefix's KV cache) made into an RL policy.

Sampling makes every denoising step a Gaussian transition with an exact log-probability, one of
three ways (policy.flow_rl: `fixed`, πRL's Flow-Noise, πRL's Flow-SDE; policies/flow_rl.py says
each one). The shard stores the whole chain x_0..x_S, which is all the Trainer needs to recompute
log pi with gradients; the executed chunk is x_S clipped to [-1, 1]. V(s) is a linear head on the
mean of the prefix's last hidden states (valid positions).

Random-initialised from `policy` sizes, or `policy.pretrained`: a local PI0 folder (transformers'
or LeRobot's layout; chunk size, action and state dims must fit this env); nothing is downloaded.
A LeRobot folder's normaliser (policy_{pre,post}processor.json + their statistics: layout.py)
normalises the proprio before the model and un-normalises the executed chunk; the instruction is
encoded by the Simulator with PaliGemma's tokenizer (pi.layout.Pi0Prompt, policy.tokenizer).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import flow_rl
from ..base import Policy, load_strict
from .layout import folder_normaliser


def tiny_pi0_config(pcfg, spec):
    from transformers import PI0Config

    d, heads = pcfg.d_model, pcfg.heads
    gemma = dict(model_type="gemma", hidden_size=d, num_hidden_layers=pcfg.layers, intermediate_size=4 * d,
                 num_attention_heads=heads, num_key_value_heads=1, head_dim=d // heads, vocab_size=pcfg.vocab + 1)
    return PI0Config(
        vlm_config=dict(model_type="paligemma", text_config=gemma, projection_dim=d, image_token_id=pcfg.vocab,
                        vocab_size=pcfg.vocab + 1,
                        vision_config=dict(model_type="siglip_vision_model", hidden_size=d, intermediate_size=4 * d,
                                           patch_size=pcfg.patch, image_size=spec.image_size,
                                           num_hidden_layers=pcfg.layers, num_attention_heads=heads,
                                           vision_use_head=False)),
        dit_config=gemma, chunk_size=spec.chunk, max_state_dim=spec.proprio_dim, max_action_dim=spec.action_dim,
        num_inference_steps=pcfg.denoise_steps)


def published_pi0(device: str | torch.device = "meta"):
    """π0 at its published size, random, on `device` (meta: allocating no memory): transformers'
    PI0Config defaults are lerobot/pi0's (PaliGemma: SigLIP So400m/14 + Gemma 2B, 18 x 2048;
    Gemma-300M action expert, 18 x 1024; chunk 50, state and action padded to 32, 10 denoising steps)."""
    from transformers import PI0Config, PI0ForConditionalGeneration

    with torch.device(device):
        return PI0ForConditionalGeneration(PI0Config())


class Pi0Flow(Policy):
    # The prefix's KV cache is filled by the VLM's layers and extended by the expert's at each
    # denoising step: policy.grad_checkpointing recomputes the vision tower only.
    cache_writers = ("model.model.vlm.language_model", "model.model.dit")
    fully_trained = ("value_head", "noise_head")

    def __init__(self, pcfg, spec, published: bool = False):
        """published: the published configuration, random, no folder read, on the default device
        (meta: the Trainer's memory footprint, benchmarks/footprint.py)."""
        super().__init__()
        torch.manual_seed(pcfg.init_seed)
        self.chunk, self.action_dim, self.steps = spec.chunk, spec.action_dim, pcfg.denoise_steps
        self.start_std = pcfg.flow_start_std
        self.model = self.published() if published else self.build(pcfg, spec)
        c = self.model.config
        if c.chunk_size != spec.chunk or c.max_action_dim < spec.action_dim or c.max_state_dim < spec.proprio_dim:
            raise ValueError(f"the PI0 model has chunk_size={c.chunk_size}, max_action_dim={c.max_action_dim}, "
                             f"max_state_dim={c.max_state_dim}; this run needs policy.chunk={spec.chunk}, "
                             f"{spec.action_dim} action dims, {spec.proprio_dim} proprio dims")
        self.flow, self.sde_level = pcfg.flow_rl, pcfg.flow_sde_level
        if self.flow == "fixed":
            self.log_std = nn.Parameter(torch.full((spec.action_dim,), math.log(pcfg.flow_noise_std)))
        elif self.flow == "noise":
            self.noise_head = flow_rl.NoiseHead(spec.action_dim, pcfg.flow_noise_std)
        self.value_head = nn.Linear(self.prefix_width(), 1)
        state, self.action_affine = self.normaliser(pcfg, spec)
        self.register_buffer("state_scale", torch.from_numpy(state[0]), persistent=False)
        self.register_buffer("state_shift", torch.from_numpy(state[1]), persistent=False)

    def normaliser(self, pcfg, spec):
        """((scale, shift) of the proprio, (scale, shift) of the actions): the folder's statistics."""
        return folder_normaliser(pcfg.pretrained, spec, self.reads_state(pcfg))

    @staticmethod
    def reads_state(pcfg) -> bool:
        """Whether the proprio reaches the model (π0: as the expert's state token), so that a
        folder's state statistics are read and their size checked against the env's."""
        return True

    def build(self, pcfg, spec):
        """The flow model: transformers' PI0, loaded from policy.pretrained or random at `policy` sizes."""
        from transformers import PI0ForConditionalGeneration

        if pcfg.pretrained:
            return load_strict(PI0ForConditionalGeneration, Path(pcfg.pretrained), "PI0")
        return PI0ForConditionalGeneration(tiny_pi0_config(pcfg, spec))

    def published(self):
        return published_pi0(torch.get_default_device())

    def prefix_width(self) -> int:
        """The width of the prefix's hidden states (V(s) reads their mean)."""
        return self.model.config.vlm_config.text_config.hidden_size

    def velocity(self, cache, mask, state, x, t):
        """v(x_t, t | prefix, state) [n, K, max_action_dim] (x padded to max_action_dim)."""
        return self.model(state=state, noise=x, timestep=t, attention_mask=mask, cache=cache).logits

    # ------------------------------------------------------------ pieces
    def _prefix(self, images, proprio, tokens):
        """Run the VLM over [image tokens | instruction] once: its KV cache, mask and V(s)."""
        n, cams = images.shape[:2]
        vlm = self.model.config.vlm_config
        size = vlm.vision_config.image_size
        x = images.permute(0, 1, 4, 2, 3).float().div(127.5).sub(1.0)   # SigLIP: [-1, 1], [n, cams, 3, H, W]
        if x.shape[-1] != size:
            x = nn.functional.interpolate(x.flatten(0, 1), size=(size, size), mode="bilinear",
                                          align_corners=False).unflatten(0, (n, cams))
        per_image = (size // vlm.vision_config.patch_size) ** 2
        img_ids = torch.full((n, cams * per_image), vlm.image_token_id, dtype=torch.long, device=tokens.device)
        ids = torch.cat([img_ids, tokens.long()], 1)
        mask = torch.cat([torch.ones_like(img_ids), (tokens != 0).long()], 1)
        cam_mask = torch.ones(n, cams, dtype=torch.bool, device=tokens.device)
        emb = self.model.model.embed_prefix(ids, x, cam_mask)
        out = self.model.model.vlm(inputs_embeds=emb, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                                   token_type_ids=torch.zeros_like(mask), use_cache=True)
        m = mask[..., None].to(out.last_hidden_state.dtype)
        pooled = (out.last_hidden_state * m).sum(1) / m.sum(1)
        return out.cache, mask, self.value_head(pooled)[:, 0]

    def _state(self, proprio):
        pad = self.model.config.max_state_dim - proprio.shape[1]
        return nn.functional.pad(proprio.float() * self.state_scale + self.state_shift, (0, pad))

    def direction(self, cache, mask, state, x, k):
        """u_k = dx/dtau at the chain's k-th state (flow_rl's time: tau = 1 - k/S the noise
        fraction): π0 predicts it as its velocity at t = tau (actions padded to the model's
        max_action_dim and cut back)."""
        n = x.shape[0]
        t = torch.full((n,), flow_rl.noise_level(k, self.steps), dtype=torch.float32, device=x.device)
        xp = nn.functional.pad(x, (0, self.model.config.max_action_dim - self.action_dim))
        return self.step_velocity(cache, mask, state, xp, t)[..., :self.action_dim]

    def transition(self, cache, mask, state, x, k, stochastic=None):
        """(mean, std) of the chain's step k from x_k (policy.flow_rl's way)."""
        u = self.direction(cache, mask, state, x, k)
        return flow_rl.transition(self.flow, x, u, k, self.steps, sigma=self._sigma() if self.flow == "fixed" else None,
                                  noise_head=getattr(self, "noise_head", None), sde_level=self.sde_level,
                                  stochastic=stochastic)

    def step_velocity(self, cache, mask, state, x, t):
        """The velocity of one denoising step, the KV cache left as the prefix filled it: the
        step's tokens are dropped, so the next step attends to the prefix only."""
        prefix_len = cache.get_seq_length()
        v = self.velocity(cache, mask, state, x, t)
        cache.crop(prefix_len - cache.get_seq_length())
        return v

    def _sigma(self):
        return self.log_std.clamp(*flow_rl.LOG_STD_RANGE).exp()

    # ------------------------------------------------------------ the policy interface
    @torch.no_grad()
    def act(self, images, proprio, tokens, noise):
        """Denoise from x_0 = policy.flow_start_std * noise[:, 0] with noise[:, k+1] injected at
        step k: chain [n, S+1, K, D] (x_0 is kept, so evaluate conditions on it as act did)."""
        cache, mask, value = self._prefix(images, proprio, tokens)
        state = self._state(proprio)
        stochastic = noise[:, 1:].flatten(1).abs().amax(1) > 0   # greedy chains inject none: the ODE
        x = noise[:, 0] * self.start_std
        chain, logp = [x], torch.zeros(x.shape[0], device=x.device)
        for k in range(self.steps):
            mean, std = self.transition(cache, mask, state, x, k, stochastic)
            x = mean + std * noise[:, k + 1]
            logp = logp + flow_rl.gaussian_logp(mean, std, x).sum((-1, -2))
            chain.append(x)
        return torch.stack(chain, 1), logp, value.float()

    def evaluate(self, images, proprio, tokens, sample, per_token: bool = False):
        """log pi of the stored chain (per_token: of each action coordinate's S transitions), the
        entropy of its S Gaussian steps, V(s)."""
        cache, mask, value = self._prefix(images, proprio, tokens)
        state = self._state(proprio)
        logp, entropy = 0.0, 0.0
        for k in range(self.steps):
            mean, std = self.transition(cache, mask, state, sample[:, k], k)
            logp = logp + flow_rl.gaussian_logp(mean, std, sample[:, k + 1])
            entropy = entropy + flow_rl.gaussian_entropy(std, mean)   # a tensor of its own per sample (FSDP hooks outputs)
        return self.coordinate_logp(logp, per_token), entropy, value.float()

    def bc_loss(self, images, proprio, tokens, sample, actions):
        """π0's own flow-matching loss per sample [n] (SFT): x_t = t*eps + (1-t)*a with t drawn as
        π0 draws it, regress v(x_t, t) on eps - a."""
        cache, mask, _ = self._prefix(images, proprio, tokens)
        scale, shift = (torch.as_tensor(v, device=actions.device) for v in self.action_affine)
        a = actions.float() * scale + shift   # the folder's normalised units (identity without statistics)
        n = a.shape[0]
        c = self.model.config
        t = torch.distributions.Beta(c.time_sampling_beta_alpha, c.time_sampling_beta_beta).sample((n,)).to(a.device)
        t = t * c.time_sampling_scale + c.time_sampling_offset
        eps = torch.randn_like(a)
        x_t = t[:, None, None] * eps + (1 - t[:, None, None]) * a
        pad = (0, c.max_action_dim - self.action_dim)
        v = self.velocity(cache, mask, self._state(proprio), nn.functional.pad(x_t, pad), t)[..., :self.action_dim]
        return ((v - (eps - a)) ** 2).mean((-1, -2))

    def expert_sample(self, layout, actions: np.ndarray, bins: int) -> np.ndarray:
        """A chain ending at the actions in the folder's normalised units (x_S; SFT regresses
        the flow on them, bc_loss)."""
        scale, shift = self.action_affine
        return super().expert_sample(layout, np.asarray(actions, np.float32) * scale + shift, bins)

    def to_env_action(self, sample: np.ndarray) -> np.ndarray:
        """x_S, un-normalised (the folder's action statistics; identity without them), within the env's [-1, 1]."""
        scale, shift = self.action_affine
        return np.clip((sample[:, -1] - shift) / scale, -1.0, 1.0).astype(np.float32)
