"""GR00T N1.5 (NVIDIA, `nvidia/GR00T-N1.5-3B`; layout: docs/layouts/gr00t-n1.5.md) as the flow
model of an RL policy, on transformers' SigLIP and Qwen3 modules; module names are the released
file's, so its tensors load by name.

- backbone (Eagle 2.5): SigLIP at 224 px, patch 14 (256 tokens an image, no pixel shuffle), one
  Linear (`mlp1`) to the LM's width; Qwen3-1.7B cut to its first 12 layers. The prompt's image
  placeholders (`<IMG_CONTEXT>`, 256 per camera) take the image tokens, camera after camera; the
  features are the LM's normed last hidden states, 2048 wide.
- action head: LayerNorm (`vlln`) and 4 pre-LN transformer blocks over the features; a DiT of 16
  blocks (32 heads of 48) with adaptive LayerNorm on the timestep, even blocks cross-attending
  to the features, odd ones self-attending; embodiment-specific MLPs for the state (padded to 64)
  in, the noisy actions in (with a sinusoid of the timestep) and the velocity out. The DiT's
  sequence is [state token | 32 future tokens | 16 action tokens + positions].
- flow: t from 0 (noise) to 1 (actions), x_t = (1 - t) eps + t a, v ~ a - eps; the timestep the
  networks read is int(t * 1000); 4 Euler steps x += v / 4.
GR00T attends over every backbone token, padding included (its batches are left-padded); here
the prompt is right-padded and padding is masked out of the action head's attention, which is
what GR00T computes for one unpadded prompt.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

TIMESTEP_BUCKETS = 1000


@dataclass
class Gr00tConfig:
    vision: dict                  # SiglipVisionConfig kwargs
    text: dict                    # Qwen3Config kwargs (layers already cut to the kept ones)
    action_horizon: int
    max_state_dim: int
    max_action_dim: int
    hidden_size: int = 1024               # the state/action MLPs' hidden width
    input_embedding_dim: int = 1536       # the DiT's width
    dit_layers: int = 16
    dit_heads: int = 32
    dit_head_dim: int = 48
    dit_output_dim: int = 1024
    vl_layers: int = 4
    vl_heads: int = 32
    vl_head_dim: int = 64
    future_tokens: int = 32
    embodiments: int = 32
    max_seq_len: int = 1024
    num_inference_steps: int = 4
    timestep_buckets: int = TIMESTEP_BUCKETS
    embodiment: int = 31                  # the weight bank row the run uses (new_embodiment)
    # GR00T's time draw for the flow loss (SFT): t = (0.999 - Beta(1.5, 1)) / 0.999
    noise_beta: tuple = (1.5, 1.0)
    noise_s: float = 0.999

    @property
    def chunk_size(self) -> int:
        return self.action_horizon

    @property
    def tokens_per_image(self) -> int:
        return (self.vision["image_size"] // self.vision["patch_size"]) ** 2


def published_config() -> Gr00tConfig:
    """GR00T N1.5-3B: SigLIP So400m/14 at 224 (27 x 1152), Qwen3-1.7B's first 12 layers (2048 wide,
    16 heads and 8 KV heads of 128), the action head of the released config.json."""
    vision = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                  patch_size=14, image_size=224)
    text = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=12, num_attention_heads=16,
                num_key_value_heads=8, head_dim=128, vocab_size=151680, rope_theta=1e6)
    return Gr00tConfig(vision, text, action_horizon=16, max_state_dim=64, max_action_dim=32)


# ------------------------------------------------------------------ building blocks
class CategorySpecificLinear(nn.Module):
    """One Linear per embodiment: y = x @ W[e] + b[e] (W [E, in, out], b [E, out])."""

    def __init__(self, embodiments: int, fan_in: int, fan_out: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(embodiments, fan_in, fan_out) * 0.02)
        self.b = nn.Parameter(torch.zeros(embodiments, fan_out))

    def forward(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return x @ self.W[e] + self.b[e]


class CategorySpecificMLP(nn.Module):
    def __init__(self, embodiments: int, fan_in: int, hidden: int, fan_out: int):
        super().__init__()
        self.layer1 = CategorySpecificLinear(embodiments, fan_in, hidden)
        self.layer2 = CategorySpecificLinear(embodiments, hidden, fan_out)

    def forward(self, x: torch.Tensor, e: int) -> torch.Tensor:
        return self.layer2(nn.functional.relu(self.layer1(x, e)), e)


def sinusoid(t: torch.Tensor, width: int) -> torch.Tensor:
    """[sin | cos] of t [n] (or [n, K]) at width/2 frequencies exp(-i ln(10000) / (width/2))."""
    half = width // 2
    freq = torch.exp(-torch.arange(half, dtype=torch.float32, device=t.device) * (math.log(10000.0) / half))
    angle = t.float()[..., None] * freq
    return torch.cat([angle.sin(), angle.cos()], -1)


class ActionEncoder(nn.Module):
    """Noisy actions and the timestep to action tokens: W3(swish(W2([W1(x) | sinusoid(tau)])))."""

    def __init__(self, embodiments: int, action_dim: int, width: int):
        super().__init__()
        self.W1 = CategorySpecificLinear(embodiments, action_dim, width)
        self.W2 = CategorySpecificLinear(embodiments, 2 * width, width)
        self.W3 = CategorySpecificLinear(embodiments, width, width)

    def forward(self, x: torch.Tensor, tau: torch.Tensor, e: int) -> torch.Tensor:
        a = self.W1(x, e)
        time = sinusoid(tau, a.shape[-1]).to(a.dtype)[:, None].expand_as(a)
        return self.W3(nn.functional.silu(self.W2(torch.cat([a, time], -1), e)), e)


class Attention(nn.Module):
    """Multi-head attention with diffusers' names (to_q, to_k, to_v, to_out.0), biases."""

    def __init__(self, width: int, heads: int, head_dim: int, context_width: int | None = None):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(width, inner)
        self.to_k = nn.Linear(context_width or width, inner)
        self.to_v = nn.Linear(context_width or width, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, width)])

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, key_mask: torch.Tensor | None = None):
        context = x if context is None else context
        split = lambda t: t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context))
        mask = None if key_mask is None else key_mask[:, None, None, :]
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out[0](out.transpose(1, 2).flatten(2))


class GeluProj(nn.Module):
    def __init__(self, fan_in: int, fan_out: int):
        super().__init__()
        self.proj = nn.Linear(fan_in, fan_out)

    def forward(self, x):
        return nn.functional.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """diffusers' FeedForward names: net.0.proj (GELU, tanh), net.1 (dropout), net.2."""

    def __init__(self, width: int, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([GeluProj(width, mult * width), nn.Identity(), nn.Linear(mult * width, width)])

    def forward(self, x):
        for m in self.net:
            x = m(x)
        return x


class VLBlock(nn.Module):
    """A pre-LN self-attention block over the backbone's features (the action head's `vl_self_attention`)."""

    def __init__(self, width: int, heads: int, head_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn1 = Attention(width, heads, head_dim)
        self.norm3 = nn.LayerNorm(width)
        self.ff = FeedForward(width)

    def forward(self, x, key_mask):
        x = x + self.attn1(self.norm1(x), key_mask=key_mask)
        return x + self.ff(self.norm3(x))


class AdaNorm(nn.Module):
    """LayerNorm without affine, then (1 + scale) and shift from the timestep embedding (scale first)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, 2 * width)

    def forward(self, x, temb):
        scale, shift = self.linear(nn.functional.silu(temb)).chunk(2, -1)
        return nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5) * (1 + scale[:, None]) + shift[:, None]


class DiTBlock(nn.Module):
    def __init__(self, width: int, heads: int, head_dim: int, context_width: int | None):
        super().__init__()
        self.norm1 = AdaNorm(width)
        self.attn1 = Attention(width, heads, head_dim, context_width)
        self.ff = FeedForward(width)
        self.cross = context_width is not None

    def forward(self, x, temb, context, key_mask):
        n = self.norm1(x, temb)
        x = x + (self.attn1(n, context, key_mask) if self.cross else self.attn1(n))
        return x + self.ff(nn.functional.layer_norm(x, x.shape[-1:], eps=1e-5))


class TimestepEmbedder(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear_1 = nn.Linear(256, width)
        self.linear_2 = nn.Linear(width, width)

    def forward(self, tau):
        # diffusers' Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1): [cos | sin]
        freq = torch.exp(-math.log(10000.0) * torch.arange(128, dtype=torch.float32, device=tau.device) / 127)
        angle = tau.float()[:, None] * freq
        emb = torch.cat([angle.cos(), angle.sin()], -1).to(self.linear_1.weight.dtype)
        return self.linear_2(nn.functional.silu(self.linear_1(emb)))


class TimestepEncoder(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedder(width)


class DiT(nn.Module):
    def __init__(self, c: Gr00tConfig, context_width: int):
        super().__init__()
        w = c.dit_heads * c.dit_head_dim
        self.timestep_encoder = TimestepEncoder(w)
        self.transformer_blocks = nn.ModuleList(
            [DiTBlock(w, c.dit_heads, c.dit_head_dim, context_width if i % 2 == 0 else None) for i in range(c.dit_layers)])
        self.proj_out_1 = nn.Linear(w, 2 * w)
        self.proj_out_2 = nn.Linear(w, c.dit_output_dim)

    def forward(self, x, tau, context, key_mask):
        temb = self.timestep_encoder.timestep_embedder(tau)
        for block in self.transformer_blocks:
            x = block(x, temb, context, key_mask)
        shift, scale = self.proj_out_1(nn.functional.silu(temb)).chunk(2, -1)   # shift first, as released
        x = nn.functional.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out_2(x)


class VLSelfAttention(nn.Module):
    def __init__(self, c: Gr00tConfig, width: int):
        super().__init__()
        self.transformer_blocks = nn.ModuleList([VLBlock(width, c.vl_heads, c.vl_head_dim) for _ in range(c.vl_layers)])

    def forward(self, x, key_mask):
        for block in self.transformer_blocks:
            x = block(x, key_mask)
        return x


class ActionHead(nn.Module):
    def __init__(self, c: Gr00tConfig):
        super().__init__()
        vl = c.text["hidden_size"]
        w = c.input_embedding_dim
        self.vlln = nn.LayerNorm(vl)
        self.vl_self_attention = VLSelfAttention(c, vl)
        self.model = DiT(c, vl)
        self.state_encoder = CategorySpecificMLP(c.embodiments, c.max_state_dim, c.hidden_size, w)
        self.action_encoder = ActionEncoder(c.embodiments, c.max_action_dim, w)
        self.action_decoder = CategorySpecificMLP(c.embodiments, c.dit_output_dim, c.hidden_size, c.max_action_dim)
        self.position_embedding = nn.Embedding(c.max_seq_len, w)
        self.future_tokens = nn.Embedding(c.future_tokens, w)


# ------------------------------------------------------------------ the model
class LanguageModel(nn.Module):
    """Qwen3 under `language_model.model` (its tied lm_head is not needed: the features are hidden states)."""

    def __init__(self, text: dict):
        super().__init__()
        from transformers import Qwen3Config, Qwen3Model

        self.model = Qwen3Model(Qwen3Config(**{"rms_norm_eps": 1e-6, "tie_word_embeddings": True, **text}))


class EagleModel(nn.Module):
    def __init__(self, c: Gr00tConfig):
        super().__init__()
        from transformers import SiglipVisionConfig, SiglipVisionModel

        # transformers 4.x's SiglipVisionModel held its tower as `.vision_model` (the released names): kept so
        self.vision_model = nn.Module()
        self.vision_model.vision_model = SiglipVisionModel(SiglipVisionConfig(
            **{"layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh", "vision_use_head": False, **c.vision}))
        self.mlp1 = nn.Sequential(nn.Linear(c.vision["hidden_size"], c.text["hidden_size"]))
        self.language_model = LanguageModel(c.text)


class Backbone(nn.Module):
    def __init__(self, c: Gr00tConfig):
        super().__init__()
        self.eagle_model = EagleModel(c)


@dataclass
class Features:
    """The backbone's output the denoising steps read."""

    hidden: torch.Tensor       # [n, L, 2048] after vlln and the VL self-attention
    valid: torch.Tensor        # bool [n, L]
    state: torch.Tensor        # the state token [n, 1, width]


class Gr00tModel(nn.Module):
    def __init__(self, config: Gr00tConfig):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.action_head = ActionHead(config)

    @property
    def eagle(self):
        return self.backbone.eagle_model

    def image_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [n, cams, H, W, 3] -> [n, cams * 256, width]: [-1, 1], bilinear to the tower's size."""
        n, cams = images.shape[:2]
        size = self.config.vision["image_size"]
        x = images.flatten(0, 1).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
        if x.shape[-1] != size:
            x = nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        tower = self.eagle.vision_model.vision_model
        h = tower(pixel_values=x.to(tower.embeddings.patch_embedding.weight.dtype)).last_hidden_state
        return self.eagle.mlp1(h).unflatten(0, (n, cams)).flatten(1, 2)

    def features(self, images: torch.Tensor, tokens: torch.Tensor, state: torch.Tensor, image_token: int | None) -> Features:
        """The LM over the prompt with the image tokens in its placeholders, the ids `image_token`
        (Eagle's <IMG_CONTEXT>; None: a random-initialised model's hashed prompt, the image tokens
        before it), then the action head's VL self-attention; and the state token."""
        c, lm = self.config, self.eagle.language_model.model
        img = self.image_tokens(images)
        ids = tokens.long()
        text = lm.embed_tokens(ids).to(img.dtype)
        if image_token is not None:
            slots = ids == image_token
            if int(slots.sum()) != img.shape[0] * img.shape[1]:
                raise ValueError(f"the prompt holds {int(slots.sum()) // img.shape[0]} image placeholders a row; the "
                                 f"{images.shape[1]} cameras give {img.shape[1]} image tokens")
            h = text.masked_scatter(slots[..., None], img)
            valid = ids != 0
        else:
            h = torch.cat([img, text], 1)
            valid = torch.cat([torch.ones(img.shape[:2], dtype=torch.bool, device=ids.device), ids != 0], 1)
        out = lm(inputs_embeds=h, attention_mask=valid.long(), use_cache=False).last_hidden_state
        head = self.action_head
        hidden = head.vl_self_attention(head.vlln(out), valid)
        return Features(hidden, valid, head.state_encoder(state, c.embodiment)[:, None])

    def velocity(self, f: Features, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t) [n, horizon, max_action_dim] (t in [0, 1], read as int(t * buckets))."""
        c, head = self.config, self.action_head
        tau = (t * c.timestep_buckets).long()
        actions = head.action_encoder(x, tau, c.embodiment)
        actions = actions + head.position_embedding.weight[:actions.shape[1]]
        n = x.shape[0]
        future = head.future_tokens.weight[None].expand(n, -1, -1)
        seq = torch.cat([f.state.to(actions.dtype), future.to(actions.dtype), actions], 1)
        out = head.model(seq, tau, f.hidden, f.valid)
        return head.action_decoder(out, c.embodiment)[:, -x.shape[1]:]
