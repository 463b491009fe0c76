"""NVIDIA's GR00T N1.5 folder (`nvidia/GR00T-N1.5-3B` and its fine-tunes): config.json
(model_type gr00t_n1_5, backbone_cfg, action_head_cfg), the weights as safetensors (one file or
shards with model.safetensors.index.json) under the module names of model.py, and
experiment_cfg/metadata.json (layout.py). Read strictly; sizes from the tensors and config.json,
so a tiny copy in the same layout loads through the same code. Two tensor groups a save may hold
and the forward never reads are dropped by name: SigLIP's pooling head and a tied `lm_head`.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..base import checked_config
from . import layout
from .model import Gr00tConfig, Gr00tModel, published_config

VISION = "backbone.eagle_model.vision_model.vision_model."
TEXT = "backbone.eagle_model.language_model.model."
HEAD = "action_head."
UNUSED = (VISION + "head.", "backbone.eagle_model.language_model.lm_head.")
VISION_HEAD_DIM = 72   # SigLIP So400m's head size (1152 / 16): the tensors do not tell the head count


def layers(t: dict, prefix: str) -> int:
    return len({int(m.group(1)) for n in t if (m := re.match(re.escape(prefix) + r"(\d+)\.", n))})


def config_of(cfg: dict, t: dict[str, torch.Tensor], embodiment: int) -> Gr00tConfig:
    head_cfg = cfg["action_head_cfg"]
    dit, vl = head_cfg["diffusion_model_cfg"], head_cfg["vl_self_attention_cfg"]
    patch, pos = t[VISION + "embeddings.patch_embedding.weight"], t[VISION + "embeddings.position_embedding.weight"]
    q, k = t[TEXT + "layers.0.self_attn.q_proj.weight"], t[TEXT + "layers.0.self_attn.k_proj.weight"]
    head_dim = t[TEXT + "layers.0.self_attn.q_norm.weight"].shape[0]
    vision = dict(hidden_size=patch.shape[0], patch_size=patch.shape[-1], image_size=round(pos.shape[0] ** 0.5) * patch.shape[-1],
                  num_hidden_layers=layers(t, VISION + "encoder.layers."), num_attention_heads=max(1, patch.shape[0] // VISION_HEAD_DIM),
                  intermediate_size=t[VISION + "encoder.layers.0.mlp.fc1.weight"].shape[0])
    text = dict(hidden_size=q.shape[1], num_hidden_layers=layers(t, TEXT + "layers."), num_attention_heads=q.shape[0] // head_dim,
                num_key_value_heads=k.shape[0] // head_dim, head_dim=head_dim, vocab_size=t[TEXT + "embed_tokens.weight"].shape[0],
                intermediate_size=t[TEXT + "layers.0.mlp.gate_proj.weight"].shape[0], rope_theta=1e6)
    state = t[HEAD + "state_encoder.layer1.W"]
    return Gr00tConfig(vision, text, action_horizon=head_cfg.get("action_horizon", cfg.get("action_horizon", 16)),
                       max_state_dim=state.shape[1], max_action_dim=t[HEAD + "action_encoder.W1.W"].shape[1],
                       hidden_size=state.shape[2], input_embedding_dim=t[HEAD + "state_encoder.layer2.W"].shape[2],
                       dit_layers=dit["num_layers"], dit_heads=dit["num_attention_heads"], dit_head_dim=dit["attention_head_dim"],
                       dit_output_dim=dit["output_dim"], vl_layers=vl["num_layers"], vl_heads=vl["num_attention_heads"],
                       vl_head_dim=vl["attention_head_dim"], future_tokens=t[HEAD + "future_tokens.weight"].shape[0],
                       embodiments=state.shape[0], max_seq_len=t[HEAD + "position_embedding.weight"].shape[0],
                       num_inference_steps=head_cfg.get("num_inference_timesteps", 4),
                       timestep_buckets=head_cfg.get("num_timestep_buckets", 1000), embodiment=embodiment,
                       noise_beta=(head_cfg.get("noise_beta_alpha", 1.5), head_cfg.get("noise_beta_beta", 1.0)),
                       noise_s=head_cfg.get("noise_s", 0.999))


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    raise FileNotFoundError(f"{folder}: no model.safetensors nor model.safetensors.index.json")


def load_folder(folder: str | Path, embodiment: int) -> Gr00tModel:
    """A GR00T N1.5 folder, strictly (what differs is named), its weight bank row `embodiment` in use."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = layout.read_config(folder)
    tensors = {}
    for f in weight_files(folder):
        tensors.update({k: v for k, v in load_file(f).items() if not k.startswith(UNUSED)})
    config = checked_config(cfg, tensors, lambda c, t: config_of(c, t, embodiment), Gr00tModel,
                            f"{folder}: not GR00T N1.5's layout")
    model = Gr00tModel(config)
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model


def save_folder(model: Gr00tModel, folder: str | Path, metadata: dict) -> None:
    """The released layout (tiny test copies): config.json, model.safetensors, experiment_cfg/metadata.json."""
    from safetensors.torch import save_file

    folder = Path(folder)
    (folder / "experiment_cfg").mkdir(parents=True, exist_ok=True)
    c = model.config
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors", metadata={"format": "pt"})
    head = {"action_dim": c.max_action_dim, "action_horizon": c.action_horizon, "add_pos_embed": True,
            "backbone_embedding_dim": c.text["hidden_size"], "hidden_size": c.hidden_size,
            "input_embedding_dim": c.input_embedding_dim, "max_action_dim": c.max_action_dim, "max_state_dim": c.max_state_dim,
            "noise_beta_alpha": c.noise_beta[0], "noise_beta_beta": c.noise_beta[1], "noise_s": c.noise_s,
            "num_inference_timesteps": c.num_inference_steps, "num_target_vision_tokens": c.future_tokens,
            "num_timestep_buckets": c.timestep_buckets, "use_vlln": True,
            "diffusion_model_cfg": {"attention_head_dim": c.dit_head_dim, "cross_attention_dim": c.text["hidden_size"],
                                    "interleave_self_attention": True, "norm_type": "ada_norm",
                                    "num_attention_heads": c.dit_heads, "num_layers": c.dit_layers, "output_dim": c.dit_output_dim},
            "vl_self_attention_cfg": {"attention_head_dim": c.vl_head_dim, "num_attention_heads": c.vl_heads,
                                      "num_layers": c.vl_layers}}
    cfg = {"model_type": "gr00t_n1_5", "architectures": ["GR00T_N1_5"], "action_horizon": c.action_horizon,
           "action_dim": c.max_action_dim, "backbone_cfg": {"select_layer": c.text["num_hidden_layers"], "project_to_dim": None},
           "action_head_cfg": head}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    (folder / "experiment_cfg" / "metadata.json").write_text(json.dumps(metadata, indent=1))


def published_gr00t(device: str | torch.device = "meta") -> Gr00tModel:
    """GR00T N1.5-3B at its published size, random, on `device` (meta: allocating no memory)."""
    with torch.device(device):
        return Gr00tModel(published_config())
