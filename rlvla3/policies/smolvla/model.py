"""SmolVLA (Shukor et al. 2025, arXiv 2506.01844; LeRobot's `lerobot/smolvla_base` layout:
docs/layouts/smolvla-base.md) as the flow model of an RL policy.

The architecture, built here on transformers' SmolVLM (vision tower, pixel-shuffle connector) and
Llama (decoder layers) modules, run layer by layer because the VLM and the action expert share
each layer's attention:
- prefix: each camera resized with padding (left/top) to the tower's size and put in [-1, 1],
  SigLIP, the connector's 4x pixel shuffle (64 tokens a camera at 512 px), scaled by sqrt(width);
  the instruction's embeddings, scaled the same; one state token, `state_proj(state)`. Images and
  instruction attend to each other; the state token attends to them and itself, they not to it.
  The VLM keeps its first 16 text layers (smolvla_base) and caches each layer's post-RoPE K/V.
- expert: a narrower Llama stack (0.75 x the width; the same 15 query and 5 KV heads of 64), one
  layer per VLM layer. Even layers attend jointly to the cached prefix and the action tokens
  (causal among the actions); odd layers cross-attend: their k/v projections map the VLM's cached
  K/V (320 wide) to the expert's, the queries' positions start at 0.
- action tokens: action_in_proj(x_t) concatenated with a sinusoid of t (periods 4e-3..4) ->
  action_time_mlp_in -> SiLU -> action_time_mlp_out; the velocity is action_out_proj of the
  expert's normed output. RoPE here is LeRobot's own (base 10000, on halves), not SmolVLM2's.
The flow convention is π0's: x_t = t * eps + (1 - t) * a, v ~ eps - a, denoised from t = 1.

Module names are LeRobot's minus the leading "model.", so a folder's tensors load by name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

PUBLISHED_PARAMS = 450_046_176   # lerobot/smolvla_base's 500 tensors (docs/layouts/smolvla-base.md)
HEAD_DIM = 64                    # SmolVLM2's text and vision head size: the tensors do not tell the head count
ROPE_BASE = 10_000.0
TIME_PERIODS = (4e-3, 4.0)       # min_period, max_period of the time sinusoid (LeRobot's defaults)


@dataclass
class SmolVLAConfig:
    """The sizes of one SmolVLA (the VLM's from a transformers SmolVLMConfig)."""

    vlm: object                       # transformers.SmolVLMConfig, text layers already cut to those kept
    expert_width: int
    expert_intermediate: int
    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    num_inference_steps: int = 10
    self_attn_every: int = 2          # layer i is joint attention when i % self_attn_every == 0
    resize: int = 512                 # the square the cameras are resized-with-padding to
    # π0's time draw for the flow-matching loss (SFT): t ~ Beta(1.5, 1) * 0.999 + 0.001
    time_sampling_beta_alpha: float = 1.5
    time_sampling_beta_beta: float = 1.0
    time_sampling_scale: float = 0.999
    time_sampling_offset: float = 0.001

    @property
    def text(self):
        return self.vlm.text_config


def intermediate_size(width: int) -> int:
    """The expert's MLP width as LeRobot sizes it: 4 * (2/3) * width, up to a multiple of 256."""
    return 256 * math.ceil(int(4 * int(2 * width / 3)) / 256)


def smolvlm_config(text: dict, vision: dict, scale_factor: int):
    from transformers import SmolVLMConfig

    text = {"model_type": "llama", "head_dim": HEAD_DIM, "rms_norm_eps": 1e-5, "attention_bias": False,
            "tie_word_embeddings": False, **text}
    vision = {"layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh", **vision}
    return SmolVLMConfig(text_config=text, vision_config=vision,
                         scale_factor=scale_factor, tie_word_embeddings=False, image_token_id=text["vocab_size"] - 1)


def published_config() -> SmolVLAConfig:
    """smolvla_base: SmolVLM2-500M (SigLIP 12 x 768 at 512 px, patch 16; SmolLM2 960 wide, 15/5
    heads, 16 of its 32 layers kept) and a 720-wide expert; chunk 50, state/action padded to 32."""
    vlm = smolvlm_config(dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=16, num_attention_heads=15,
                              num_key_value_heads=5, vocab_size=49280),
                         dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              patch_size=16, image_size=512), scale_factor=4)
    return SmolVLAConfig(vlm, expert_width=720, expert_intermediate=intermediate_size(720), chunk_size=50,
                         max_state_dim=32, max_action_dim=32)


def tiny_config(pcfg, spec) -> SmolVLAConfig:
    """Random-init sizes from `policy` (d_model, layers, heads, patch, vocab): the vision tower at
    the env's image size (no resize), a 2x pixel shuffle where the patch grid allows it."""
    d, heads = pcfg.d_model, pcfg.heads
    grid = spec.image_size // pcfg.patch
    vlm = smolvlm_config(dict(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=pcfg.layers, num_attention_heads=heads,
                              num_key_value_heads=1, head_dim=d // heads, vocab_size=pcfg.vocab),
                         dict(hidden_size=d, intermediate_size=4 * d, num_hidden_layers=pcfg.layers, num_attention_heads=heads,
                              patch_size=pcfg.patch, image_size=spec.image_size), scale_factor=2 if grid % 2 == 0 else 1)
    width = 3 * d // 4
    return SmolVLAConfig(vlm, expert_width=width, expert_intermediate=intermediate_size(width), chunk_size=spec.chunk,
                         max_state_dim=spec.proprio_dim, max_action_dim=spec.action_dim,
                         num_inference_steps=pcfg.denoise_steps, resize=spec.image_size)


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary positions [n, L] on x [n, L, H, D], rotating the halves of D (LeRobot's SmolVLA)."""
    half = x.shape[-1] // 2
    freq = ROPE_BASE ** (-2.0 * torch.arange(half, dtype=torch.float32, device=x.device) / x.shape[-1])
    angle = positions[..., None, None].float() * freq
    sin, cos = angle.sin(), angle.cos()
    a, b = x.float().split(half, -1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax attention of q [n, Lq, H, D] over k, v [n, Lk, Hkv, D] (each KV head serving H/Hkv
    query heads) where `allowed` [n, Lq, Lk]; -> [n, Lq, H*D]. A row allowed nothing (a padding
    token's) averages all keys, as LeRobot's does, rather than dividing by zero."""
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    scores = torch.einsum("nqhd,nkhd->nhqk", q.float(), k.float()) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
    out = torch.einsum("nhqk,nkhd->nqhd", scores.softmax(-1).to(v.dtype), v)
    return out.flatten(2)


def time_sinusoid(t: torch.Tensor, width: int) -> torch.Tensor:
    """[sin | cos] of t at `width`/2 periods spaced geometrically over TIME_PERIODS."""
    lo, hi = TIME_PERIODS
    period = lo * (hi / lo) ** torch.linspace(0.0, 1.0, width // 2, dtype=torch.float64, device=t.device)
    angle = t.double()[:, None] * (2 * math.pi / period)
    return torch.cat([angle.sin(), angle.cos()], -1).float()


@dataclass
class Prefix:
    """What the denoising steps read: each VLM layer's post-RoPE K/V, the valid tokens, their count."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor        # bool [n, P]
    hidden: torch.Tensor       # the VLM's normed last hidden states [n, P, width]


class VLMWithExpert(nn.Module):
    """LeRobot's `vlm_with_expert`: the SmolVLM (`vlm`) and the action expert (`lm_expert`)."""

    def __init__(self, c: SmolVLAConfig):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel, SmolVLMForConditionalGeneration

        self.vlm = SmolVLMForConditionalGeneration(c.vlm)
        text = c.text
        expert = LlamaConfig(**{**text.to_dict(), "hidden_size": c.expert_width, "intermediate_size": c.expert_intermediate,
                                "num_hidden_layers": text.num_hidden_layers, "head_dim": text.head_dim})
        self.lm_expert = LlamaModel(expert)
        self.lm_expert.embed_tokens = None   # the expert reads embeddings, never ids
        kv = text.num_key_value_heads * text.head_dim
        for i, layer in enumerate(self.lm_expert.layers):
            if i % c.self_attn_every:   # cross-attention: k/v map the VLM's cached K/V
                layer.self_attn.k_proj = nn.Linear(kv, kv, bias=False)
                layer.self_attn.v_proj = nn.Linear(kv, kv, bias=False)


class SmolVLAModel(nn.Module):
    """LeRobot's `VLAFlowMatching` tensors and forward (the module docstring says what runs)."""

    def __init__(self, config: SmolVLAConfig):
        super().__init__()
        self.config = config
        text, w = config.text, config.expert_width
        self.vlm_with_expert = VLMWithExpert(config)
        self.state_proj = nn.Linear(config.max_state_dim, text.hidden_size)
        self.action_in_proj = nn.Linear(config.max_action_dim, w)
        self.action_out_proj = nn.Linear(w, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * w, w)
        self.action_time_mlp_out = nn.Linear(w, w)

    @property
    def vlm(self):
        return self.vlm_with_expert.vlm.model

    @property
    def expert(self):
        return self.vlm_with_expert.lm_expert

    # ------------------------------------------------------------ prefix
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [n, cams, H, W, 3] -> image tokens [n, cams * tokens, width], camera after camera."""
        n, cams = images.shape[:2]
        x = images.flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
        x = resize_with_pad(x, self.config.resize) * 2.0 - 1.0
        tower = self.vlm.vision_model
        h = self.vlm.connector(tower(pixel_values=x.to(tower.embeddings.patch_embedding.weight.dtype)).last_hidden_state)
        return (h * h.shape[-1] ** 0.5).unflatten(0, (n, cams)).flatten(1, 2)

    def prefix(self, images: torch.Tensor, tokens: torch.Tensor, state: torch.Tensor) -> Prefix:
        """The VLM over [image tokens | instruction | state token] (tokens: ids right-padded with 0)."""
        img = self.embed_images(images)
        lang = self.vlm.text_model.embed_tokens(tokens.long())
        lang = lang * lang.shape[-1] ** 0.5
        h = torch.cat([img, lang.to(img.dtype), self.state_proj(state)[:, None].to(img.dtype)], 1)
        n, length = h.shape[:2]
        valid = torch.cat([torch.ones(n, img.shape[1], dtype=torch.bool, device=h.device), tokens != 0,
                           torch.ones(n, 1, dtype=torch.bool, device=h.device)], 1)
        block = torch.zeros(length, dtype=torch.long, device=h.device)
        block[-1] = 1                               # the state token starts a block the others cannot see
        allowed = (block[None, :] <= block[:, None])[None] & valid[:, None, :] & valid[:, :, None]
        pos = valid.long().cumsum(-1) - 1
        split = (-1, self.config.text.head_dim)
        keys, values = [], []
        for layer in self.vlm.text_model.layers:
            y = layer.input_layernorm(h)
            q, k, v = (p(y).unflatten(-1, split) for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj))
            q, k = rope(q, pos), rope(k, pos)
            keys.append(k)
            values.append(v)
            h = self.finish(layer, h, attend(q, k, v, allowed))
        return Prefix(keys, values, valid, self.vlm.text_model.norm(h))

    @staticmethod
    def finish(layer, h: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The rest of a Llama layer after its attention: output projection, residual, MLP, residual."""
        h = h + layer.self_attn.o_proj(attention.to(h.dtype))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    # ------------------------------------------------------------ expert
    def action_tokens(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        a = self.action_in_proj(x)
        time = time_sinusoid(t, a.shape[-1]).to(a.dtype)[:, None].expand_as(a)
        return self.action_time_mlp_out(nn.functional.silu(self.action_time_mlp_in(torch.cat([a, time], -1))))

    def velocity(self, prefix: Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t | prefix) [n, K, max_action_dim]."""
        c, text = self.config, self.config.text
        h = self.action_tokens(x, t)
        n, k = h.shape[:2]
        causal = torch.ones(k, k, dtype=torch.bool, device=h.device).tril()[None].expand(n, k, k)
        sees_prefix = prefix.valid[:, None, :].expand(n, k, prefix.valid.shape[1])
        joint_pos = prefix.valid.sum(-1, keepdim=True) + torch.arange(k, device=h.device)
        cross_pos = torch.arange(k, device=h.device)[None].expand(n, k)
        split = (-1, text.head_dim)
        for i, layer in enumerate(self.expert.layers):
            a = layer.self_attn
            y = layer.input_layernorm(h)
            q = a.q_proj(y).unflatten(-1, split)
            if i % c.self_attn_every == 0:   # joint: the prefix's K/V and the actions' own
                keys = torch.cat([prefix.keys[i], rope(a.k_proj(y).unflatten(-1, split), joint_pos)], 1)
                values = torch.cat([prefix.values[i], a.v_proj(y).unflatten(-1, split)], 1)
                out = attend(rope(q, joint_pos), keys, values, torch.cat([sees_prefix, causal], -1))
            else:                            # cross: the VLM's K/V mapped by this layer's k/v
                pk, pv = prefix.keys[i].flatten(2), prefix.values[i].flatten(2)
                keys, values = a.k_proj(pk.to(y.dtype)).unflatten(-1, split), a.v_proj(pv.to(y.dtype)).unflatten(-1, split)
                out = attend(rope(q, cross_pos), keys, values, sees_prefix)
            h = self.finish(layer, h, out)
        return self.action_out_proj(self.expert.norm(h).float())


def resize_with_pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """[n, 3, H, W] in [0, 1] -> [n, 3, size, size]: resized (bilinear) keeping the aspect, padded
    with 0 on the left and top (LeRobot's SmolVLA convention); unchanged at the size already."""
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    x = nn.functional.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False)
    return nn.functional.pad(x, (size - rw, 0, size - rh, 0), value=0.0)
