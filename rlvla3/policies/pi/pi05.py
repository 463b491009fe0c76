"""`pi05`: π0.5 (openpi; LeRobot's `lerobot/pi05_base` layout: docs/layouts/pi05-base.md) as an
RL policy, sampled as `pi0` is (Gaussian noise at every denoising step, so log pi of the chain is
tractable; pi0.py says why and what is learned).

What differs from π0, and is built here on transformers' PI0 modules:
- the action expert's norms are time-conditioned (adaRMS): dense(cond) -> scale, shift, gate;
  y = rmsnorm(x) (1 + scale) + shift, and each residual branch adds gate * f(y). The condition is
  sinusoid(t) -> time_mlp_in -> SiLU -> time_mlp_out -> SiLU. The expert's layers run here (the
  gates do not fit transformers' Gemma layer), reading the prefix's KV cache as π0's do;
- the action tokens are action_in_proj(x_t) alone (no state token, no [action, time] MLP);
- the state reaches the model only as text: the Simulator writes it, normalised and cut into 256
  bins, into the prompt "Task: ..., State: ...;\\nAction: " (pi.layout.Pi05Prompt); with
  policy.discrete_state_input=false it reaches it nowhere (the prompt is the task alone).
The prefix (PaliGemma over images and prompt) is transformers' PI0Model's, as the `pi0` family runs it.

Random-initialised from `policy` sizes, or `policy.pretrained`: a LeRobot π0.5 folder (config.json
of type pi05, model.safetensors under LeRobot's names, the normaliser files), loaded strictly;
its sizes are read off the tensors, so a tiny copy in the same layout loads through the same code.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from torch import nn

from ..base import checked_config, lerobot_config
from .pi0 import Pi0Flow, tiny_pi0_config

PUBLISHED_PARAMS = 3_616_757_520   # lerobot/pi05_base's tensors (docs/layouts/pi05-base.md)
VISION_HEAD_DIM = 72               # SigLIP So400m's head size (1152 / 16): the tensors do not tell the head count
# LeRobot's names -> this module's (the inverse writes a folder); the two lm_heads are stored where
# transformers' PI0 keeps them (the VLM's is its input embedding; the expert's is unused).
RENAMES = [(r"^paligemma_with_expert\.paligemma\.model\.vision_tower\.vision_model\.", "model.vlm.vision_tower."),
           (r"^paligemma_with_expert\.paligemma\.model\.", "model.vlm."),
           (r"^paligemma_with_expert\.paligemma\.lm_head\.", "model.vlm.language_model.embed_tokens."),
           (r"^paligemma_with_expert\.gemma_expert\.model\.", "model.dit."),
           (r"^paligemma_with_expert\.gemma_expert\.lm_head\.", "model.dit.embed_tokens.")]


class AdaRMSNorm(nn.Module):
    """π0.5's time-conditioned RMSNorm (its `dense` starts at zero: a plain RMSNorm with unit gates
    off, i.e. the expert starts as a pass-through of its input)."""

    def __init__(self, width: int, cond_width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_width, 3 * width)
        nn.init.zeros_(self.dense.weight)
        nn.init.zeros_(self.dense.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, shift, gate = self.dense(cond)[:, None].chunk(3, -1)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1 + scale.float()) + shift.float()).type_as(x), gate


class Pi05Model(nn.Module):
    """PaliGemma prefix and the adaRMS Gemma expert (transformers' PI0Model with the expert's norms
    replaced), the time MLP and the action projections."""

    def __init__(self, config):
        super().__init__()
        from transformers.models.pi0.modeling_pi0 import PI0Model, PI0TimestepEmbeddings

        self.config = config
        self.model = PI0Model(config)
        dit, w = self.model.dit, config.dit_config.hidden_size
        eps = config.dit_config.rms_norm_eps
        for layer in dit.layers:
            layer.input_layernorm, layer.post_attention_layernorm = AdaRMSNorm(w, w, eps), AdaRMSNorm(w, w, eps)
        dit.norm = AdaRMSNorm(w, w, eps)
        self.time_embed = PI0TimestepEmbeddings(config)
        self.time_mlp_in, self.time_mlp_out = nn.Linear(w, w), nn.Linear(w, w)
        self.action_in_proj = nn.Linear(config.max_action_dim, w)
        self.action_out_proj = nn.Linear(w, config.max_action_dim)

    def condition(self, t: torch.Tensor) -> torch.Tensor:
        silu = nn.functional.silu
        emb = self.time_embed(t).to(self.time_mlp_in.weight.dtype)
        return silu(self.time_mlp_out(silu(self.time_mlp_in(emb))))

    def velocity(self, cache, mask: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """v(x_t, t) [n, K, max_action_dim]: the K action tokens attend to the prefix's valid
        tokens (its KV cache) and to each other; positions continue the prefix's valid count."""
        dit = self.model.dit
        n, k = x.shape[:2]
        cond = self.condition(t)
        h = self.action_in_proj(x)
        full = torch.cat([mask, torch.ones(n, k, dtype=mask.dtype, device=mask.device)], 1)
        pos = (full.cumsum(-1) - 1)[:, -k:]
        blocked = ~full.bool()[:, None, None, :].expand(n, 1, k, full.shape[1])
        bias = torch.zeros(blocked.shape, dtype=h.dtype, device=h.device).masked_fill(blocked, torch.finfo(h.dtype).min)
        rope = dit.rotary_emb(h, position_ids=pos)
        for layer in dit.layers:
            y, gate = layer.input_layernorm(h, cond)
            a, _ = layer.self_attn(hidden_states=y, position_embeddings=rope, attention_mask=bias, cache=cache)
            h = h + gate * a
            y, gate = layer.post_attention_layernorm(h, cond)
            h = h + gate * layer.mlp(y)
        return self.action_out_proj(dit.norm(h, cond)[0])


# ------------------------------------------------------------------ LeRobot's folder
def lerobot_name(name: str) -> str:
    """This module's tensor name -> LeRobot's (the inverse of RENAMES, longest match first)."""
    for src, dst in sorted(RENAMES, key=lambda r: -len(r[1])):
        if name.startswith(dst):
            return src[1:].replace("\\.", ".") + name[len(dst):]
    return name


def our_name(name: str) -> str:
    """LeRobot's tensor name (with or without the "model." its loader adds) -> this module's."""
    if name.startswith("model.") and not name.startswith(("model.vlm.", "model.dit.")):
        name = name[len("model."):]
    for src, dst in RENAMES:
        if re.match(src, name):
            return re.sub(src, dst, name)
    return name


def config_of(folder_cfg: dict, t: dict[str, torch.Tensor]):
    """The PI0Config of a LeRobot π0.5 folder: robot sizes from its config.json, tower sizes from
    its tensors (so the published gemma_2b/gemma_300m and a tiny copy load alike)."""
    from transformers import PI0Config

    def gemma(prefix: str) -> dict:
        q, k = t[prefix + "layers.0.self_attn.q_proj.weight"], t[prefix + "layers.0.self_attn.k_proj.weight"]
        layers = {int(n[len(prefix) + 7:].split(".")[0]) for n in t if n.startswith(prefix + "layers.")}
        head = k.shape[0]   # one KV head (π0.5's towers use multi-query attention)
        return dict(model_type="gemma", hidden_size=q.shape[1], num_hidden_layers=len(layers), head_dim=head,
                    intermediate_size=t[prefix + "layers.0.mlp.gate_proj.weight"].shape[0],
                    num_attention_heads=q.shape[0] // head, num_key_value_heads=1,
                    vocab_size=t[prefix + "embed_tokens.weight"].shape[0])

    v = "model.vlm.vision_tower."
    patch, pos = t[v + "embeddings.patch_embedding.weight"], t[v + "embeddings.position_embedding.weight"]
    vision_layers = {int(n[len(v) + 15:].split(".")[0]) for n in t if n.startswith(v + "encoder.layers.")}
    text = gemma("model.vlm.language_model.")
    vision = dict(model_type="siglip_vision_model", hidden_size=patch.shape[0], patch_size=patch.shape[-1],
                  image_size=round(pos.shape[0] ** 0.5) * patch.shape[-1], num_hidden_layers=len(vision_layers),
                  intermediate_size=t[v + "encoder.layers.0.mlp.fc1.weight"].shape[0],
                  num_attention_heads=max(1, patch.shape[0] // VISION_HEAD_DIM), vision_use_head=False)
    return PI0Config(vlm_config=dict(model_type="paligemma", text_config=text, vision_config=vision,
                                     projection_dim=text["hidden_size"], vocab_size=text["vocab_size"],
                                     image_token_id=text["vocab_size"]),
                     dit_config=gemma("model.dit."), chunk_size=folder_cfg["chunk_size"],
                     max_state_dim=folder_cfg["max_state_dim"], max_action_dim=folder_cfg["max_action_dim"],
                     num_inference_steps=folder_cfg.get("num_inference_steps", 10))


def load_folder(folder: str | Path) -> Pi05Model:
    """A LeRobot π0.5 folder, strictly: a missing, unexpected or misshapen tensor is an error naming it."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = lerobot_config(folder, "pi05", "LeRobot's π0.5 folder, e.g. lerobot/pi05_base")
    tensors = {our_name(k): v for k, v in load_file(folder / "model.safetensors").items()}
    config = checked_config(cfg, tensors, config_of, Pi05Model, f"{folder}: not LeRobot's π0.5 layout", lerobot_name)
    model = Pi05Model(config)
    model.load_state_dict(tensors, strict=True)
    return model


def save_folder(model: Pi05Model, folder: str | Path, tokenizer_max_length: int = 200) -> None:
    """LeRobot's layout: config.json (type pi05) and model.safetensors under its names (tiny test copies)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    tensors = {lerobot_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    cfg = {"type": "pi05", "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "dtype": "float32",
           "chunk_size": c.chunk_size, "n_action_steps": c.chunk_size, "max_state_dim": c.max_state_dim,
           "max_action_dim": c.max_action_dim, "num_inference_steps": c.num_inference_steps,
           "tokenizer_max_length": tokenizer_max_length, "image_resolution": [c.vlm_config.vision_config.image_size] * 2,
           "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"}}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))


def published_pi05(device: str | torch.device = "meta") -> Pi05Model:
    """π0.5 at its published size (the PaliGemma 2B prefix and Gemma-300M expert π0 has: PI0Config's
    defaults), random, on `device` (meta: allocating no memory)."""
    from transformers import PI0Config

    with torch.device(device):
        return Pi05Model(PI0Config())


class Pi05Flow(Pi0Flow):
    @staticmethod
    def reads_state(pcfg) -> bool:
        return pcfg.discrete_state_input   # as prompt text only (pi.layout.Pi05Prompt normalises it)

    def build(self, pcfg, spec):
        if pcfg.pretrained:
            return load_folder(pcfg.pretrained)
        return Pi05Model(tiny_pi0_config(pcfg, spec))

    def published(self):
        return published_pi05(torch.get_default_device())

    def velocity(self, cache, mask, state, x, t):
        return self.model.velocity(cache, mask, x, t)   # the state is in the prompt

    def shard_units(self):
        """The expert's layers are entered part by part (Pi05Model.velocity conditions each norm
        on the time): their attention and MLP are the units; the VLM's layers are whole."""
        expert = self.model.model.dit.layers
        parts = [m for layer in expert for m in (layer.self_attn, layer.mlp)]
        inside = {id(m) for layer in expert for m in layer.modules()}
        return [m for m in super().shard_units() if id(m) not in inside] + parts
