"""LeRobot's SmolVLA folder (`lerobot/smolvla_base` and its fine-tunes): config.json (type
smolvla) and model.safetensors under LeRobot's names, "model." + this project's module names
(model.py), read strictly; the normaliser files are LeRobot's processor pipelines
(pi.layout.folder_normaliser reads them for every LeRobot family). Sizes come from the tensors,
so the published model and a tiny copy in the same layout load through the same code; the head
counts are the widths over SmolVLM2's head size (64), which the tensors cannot tell.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ..base import LayoutError, checked_config, lerobot_config
from .layout import check_settings
from .model import HEAD_DIM, SmolVLAConfig, SmolVLAModel, smolvlm_config

PREFIX = "model."
TEXT = "vlm_with_expert.vlm.model.text_model."
VISION = "vlm_with_expert.vlm.model.vision_model."
CONNECTOR = "vlm_with_expert.vlm.model.connector.modality_projection.proj.weight"
EXPERT = "vlm_with_expert.lm_expert."


def layer_count(t: dict, prefix: str) -> int:
    return len({int(m.group(1)) for n in t if (m := re.match(re.escape(prefix) + r"layers\.(\d+)\.", n))})


def heads(width: int, what: str) -> int:
    if width % HEAD_DIM:
        raise LayoutError(f"{what} is {width} wide, not a multiple of SmolVLM2's head size {HEAD_DIM}")
    return width // HEAD_DIM


def config_of(cfg: dict, t: dict[str, torch.Tensor]) -> SmolVLAConfig:
    """The sizes of a LeRobot SmolVLA folder: the robot's and the settings from its config.json,
    the towers' from its tensors."""
    check_settings(cfg)
    q, k = t[TEXT + "layers.0.self_attn.q_proj.weight"], t[TEXT + "layers.0.self_attn.k_proj.weight"]
    layers = layer_count(t, TEXT)
    expert_layers = layer_count(t, EXPERT)
    if expert_layers != layers:
        raise LayoutError(f"{expert_layers} expert layers for {layers} VLM layers (config.json num_expert_layers="
                          f"{cfg.get('num_expert_layers')}): policy=smolvla builds one expert layer per VLM layer")
    text = dict(hidden_size=q.shape[1], num_hidden_layers=layers, num_attention_heads=heads(q.shape[0], "q_proj"),
                num_key_value_heads=heads(k.shape[0], "k_proj"), vocab_size=t[TEXT + "embed_tokens.weight"].shape[0],
                intermediate_size=t[TEXT + "layers.0.mlp.gate_proj.weight"].shape[0])
    patch, pos = t[VISION + "embeddings.patch_embedding.weight"], t[VISION + "embeddings.position_embedding.weight"]
    width = patch.shape[0]
    vision = dict(hidden_size=width, patch_size=patch.shape[-1], image_size=round(pos.shape[0] ** 0.5) * patch.shape[-1],
                  num_hidden_layers=layer_count(t, VISION + "encoder."), num_attention_heads=heads(width, "the vision tower"),
                  intermediate_size=t[VISION + "encoder.layers.0.mlp.fc1.weight"].shape[0])
    scale = round((t[CONNECTOR].shape[1] / width) ** 0.5)
    expert_width = t[EXPERT + "layers.0.self_attn.q_proj.weight"].shape[1]
    resize = cfg.get("resize_imgs_with_padding") or [vision["image_size"]] * 2
    if resize[0] != resize[1]:
        raise LayoutError(f"config.json: resize_imgs_with_padding={resize}; policy=smolvla resizes to a square")
    return SmolVLAConfig(smolvlm_config(text, vision, scale), expert_width=expert_width,
                         expert_intermediate=t[EXPERT + "layers.0.mlp.gate_proj.weight"].shape[0],
                         chunk_size=cfg["chunk_size"], max_state_dim=cfg["max_state_dim"], max_action_dim=cfg["max_action_dim"],
                         num_inference_steps=cfg.get("num_steps", 10), self_attn_every=cfg.get("self_attn_every_n_layers", 2),
                         resize=resize[0])


def load_folder(folder: str | Path) -> SmolVLAModel:
    """A LeRobot SmolVLA folder, strictly: a missing, unexpected or misshapen tensor is an error naming it."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg = lerobot_config(folder, "smolvla", "LeRobot's SmolVLA folder, e.g. lerobot/smolvla_base")
    tensors = {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in load_file(folder / "model.safetensors").items()}
    config = checked_config(cfg, tensors, config_of, SmolVLAModel, f"{folder}: not LeRobot's SmolVLA layout",
                            lambda k: PREFIX + k)
    model = SmolVLAModel(config)
    # the release mixes bf16 and fp32 tensors: each is cast to this model's dtype
    model.load_state_dict({k: v.to(model.state_proj.weight.dtype) for k, v in tensors.items()}, strict=True)
    return model


def save_folder(model: SmolVLAModel, folder: str | Path, tokenizer_max_length: int = 48) -> None:
    """LeRobot's layout: config.json (type smolvla, the keys smolvla_base's holds) and
    model.safetensors under its names (tiny test copies)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    save_file({PREFIX + k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    cfg = {"type": "smolvla", "n_obs_steps": 1, "chunk_size": c.chunk_size, "n_action_steps": c.chunk_size,
           "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
           "max_state_dim": c.max_state_dim, "max_action_dim": c.max_action_dim,
           "resize_imgs_with_padding": [c.resize, c.resize], "empty_cameras": 0, "tokenizer_max_length": tokenizer_max_length,
           "num_steps": c.num_inference_steps, "use_cache": True, "freeze_vision_encoder": True, "train_expert_only": True,
           "train_state_proj": True, "vlm_model_name": "HuggingFaceTB/SmolVLM2-500M-Video-Instruct", "load_vlm_weights": True,
           "add_image_special_tokens": False, "attention_mode": "cross_attn", "prefix_length": 0,
           "pad_language_to": "max_length", "num_expert_layers": 0, "num_vlm_layers": c.text.num_hidden_layers,
           "self_attn_every_n_layers": c.self_attn_every, "expert_width_multiplier": c.expert_width / c.text.hidden_size,
           "min_period": 0.004, "max_period": 4.0}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))


def published_smolvla(device: str | torch.device = "meta") -> SmolVLAModel:
    """smolvla_base at its published size, random, on `device` (meta: allocating no memory)."""
    from .model import published_config

    with torch.device(device):
        return SmolVLAModel(published_config())

