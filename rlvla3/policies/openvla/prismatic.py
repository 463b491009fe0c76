"""The published OpenVLA checkpoint (`openvla/openvla-7b` and its fine-tunes: a Prismatic model),
read from its released folder natively onto transformers' own classes, and written back in the
same layout (tiny copies for tests). Layout, forward and the name mapping: docs/layouts/openvla-7b.md.

    [B, 6, 224, 224] pixels -> DINOv2 ViT-L/14 + 4 registers (Dinov2WithRegistersModel)  | second-to-last
                               SigLIP So400m/14 (SiglipVisionModel)                        | block, patches
    -> concat [B, 256, 1024 + 1152] -> projector fc1/fc2/fc3 (GELU) -> [B, 256, 4096] -> Llama-2 (LlamaForCausalLM)

The folder names its towers by timm model id; their widths and depths are read off the tensors
(so a tiny copy in the same layout loads through the same code) and their head counts from the
id (`TOWERS`). The published remote code is not used: on current transformers it ignores the
image (openvla#346). Loading is strict: a missing, unexpected or misshapen tensor is an error
that names it. Action tokens: the last 256 ids below the Llama vocabulary (32000), token
32000 - 1 - bin; an action is the bin centre in [-1, 1], un-normalised with the checkpoint's
`norm_stats[unnorm_key]["action"]` q01/q99 where its mask is true.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..base import LayoutError, check_tensors
from . import layout

TOWERS = {   # timm id -> the tower's kind and what its tensors cannot tell: heads, registers
    "vit_large_patch14_reg4_dinov2.lvd142m": {"kind": "dinov2", "heads": 16, "registers": 4},
    "vit_so400m_patch14_siglip_224": {"kind": "siglip", "heads": 16},
}
PREFIX = {"dinov2": "vision_backbone.featurizer.", "siglip": "vision_backbone.fused_featurizer."}
LLAMA_VOCAB = 32000   # action token ids count down from here; the embedding is padded to 32064
# The published sizes (openvla-7b): for the parameter count on the meta device, no weights.
PUBLISHED = {"dinov2": {"hidden": 1024, "depth": 24, "mlp": 4096, "patch": 14, "image": 224},
             "siglip": {"hidden": 1152, "depth": 27, "mlp": 4304, "patch": 14, "image": 224},
             "llama": {"vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 32, "pad_token_id": 32000}}
# preprocessor_config.json of the released folders: per tower (DINOv2, SigLIP) its input size,
# mean and std; images are resized naively (no aspect kept), bicubic, antialiased.
PREPROCESSOR = {"image_processor_type": "PrismaticImageProcessor", "processor_class": "PrismaticProcessor",
                "use_fused_vision_backbone": True, "image_resize_strategy": "resize-naive",
                "input_sizes": [[3, 224, 224], [3, 224, 224]], "interpolations": ["bicubic", "bicubic"],
                "means": [[0.485, 0.456, 0.406], [0.5, 0.5, 0.5]], "stds": [[0.229, 0.224, 0.225], [0.5, 0.5, 0.5]]}
PUBLISHED_PARAMS = 7_541_237_184   # the released folder's tensors (transformers adds 2,048: DINOv2's mask token and cls position)


# ------------------------------------------------------------------ reading and writing the folder
def read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a transformers-style folder (sharded with model.safetensors.index.json, or one file)."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"policy.pretrained={folder}: no model.safetensors.index.json or model.safetensors "
                                "(the published OpenVLA folder has both the index and its shards); nothing is downloaded")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        if not (folder / f).is_file():
            raise FileNotFoundError(f"policy.pretrained={folder}: {f} is named in the index but missing")
        tensors.update(load_file(folder / f))
    return tensors


def read_config(folder: Path) -> dict:
    cfg = layout.read_config(folder)
    ids = cfg.get("timm_model_ids")
    if not ids or any(i not in TOWERS for i in ids):
        raise LayoutError(f"{folder}/config.json: timm_model_ids={ids}: expected Prismatic towers among {sorted(TOWERS)}")
    return cfg


# ------------------------------------------------------------------ the towers
def tower_sizes(tensors: dict, prefix: str) -> dict:
    """Width, depth, MLP width, patch and image size of a timm ViT, from its tensors."""
    proj = tensors[prefix + "patch_embed.proj.weight"]
    blocks = {int(k[len(prefix) + 7:].split(".")[0]) for k in tensors if k.startswith(prefix + "blocks.")}
    side = int(round(tensors[prefix + "pos_embed"].shape[1] ** 0.5))
    return {"hidden": proj.shape[0], "depth": len(blocks), "mlp": tensors[prefix + "blocks.0.mlp.fc1.weight"].shape[0],
            "patch": proj.shape[-1], "image": side * proj.shape[-1]}


def make_tower(kind: str, sizes: dict, heads: int, registers: int = 0) -> nn.Module:
    """The transformers model of a timm tower. SigLIP's GELU is the exact one (timm's nn.GELU: the
    tanh default differs by 1e-3); image_size = the trained size, so positions are never resampled."""
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel, SiglipVisionConfig, SiglipVisionModel

    common = dict(hidden_size=sizes["hidden"], num_hidden_layers=sizes["depth"], num_attention_heads=heads,
                  image_size=sizes["image"], patch_size=sizes["patch"], layer_norm_eps=1e-6, hidden_act="gelu")
    if kind == "dinov2":
        if sizes["mlp"] % sizes["hidden"]:
            raise LayoutError(f"DINOv2 tower: MLP width {sizes['mlp']} is not a multiple of its width {sizes['hidden']}")
        return Dinov2WithRegistersModel(Dinov2WithRegistersConfig(
            **common, mlp_ratio=sizes["mlp"] // sizes["hidden"], num_register_tokens=registers))
    return SiglipVisionModel(SiglipVisionConfig(**common, intermediate_size=sizes["mlp"]))


def _names(kind: str) -> tuple[str, str]:
    return ("encoder.layer", "attention") if kind == "dinov2" else ("encoder.layers", "self_attn")


def renamed(kind: str, depth: int) -> list[tuple[str, str]]:
    """(timm, transformers) names of the tower's tensors that move unchanged; the rest (fused qkv,
    positions, DINOv2's cls and mask tokens, SigLIP's pooling probe and in_proj) are converted
    by `tower_from_timm` / `tower_to_timm` themselves."""
    layer, attn = _names(kind)
    dinov2 = kind == "dinov2"
    inside = [("norm1", "norm1" if dinov2 else "layer_norm1"), ("norm2", "norm2" if dinov2 else "layer_norm2"),
              ("attn.proj", f"{attn}.{'o_proj' if dinov2 else 'out_proj'}"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")]
    modules = [(f"blocks.{i}.{a}", f"{layer}.{i}.{b}") for i in range(depth) for a, b in inside]
    if dinov2:
        modules += [("patch_embed.proj", "embeddings.patch_embeddings.projection"), ("norm", "layernorm")]
    else:   # SigLIP's pooling head: published, never used by OpenVLA
        modules += [("patch_embed.proj", "embeddings.patch_embedding"), ("norm", "post_layernorm"),
                    ("attn_pool.proj", "head.attention.out_proj"), ("attn_pool.norm", "head.layernorm"),
                    ("attn_pool.mlp.fc1", "head.mlp.fc1"), ("attn_pool.mlp.fc2", "head.mlp.fc2")]
    pairs = [(f"{a}.{s}", f"{b}.{s}") for a, b in modules for s in ("weight", "bias")]
    if dinov2:
        pairs += [(f"blocks.{i}.ls{n}.scale_factor", f"{layer}.{i}.layer_scale{n}.lambda1") for i in range(depth) for n in (1, 2)]
        pairs.append(("reg_token", "embeddings.register_tokens"))
    return pairs


def tower_from_timm(kind: str, t: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """A timm tower's tensors (prefix stripped) under transformers' names; `t` is consumed."""
    out = {dst: t.pop(src) for src, dst in renamed(kind, depth)}
    layer, attn = _names(kind)
    for i in range(depth):
        for suffix in ("weight", "bias"):   # timm fuses q, k, v row-wise
            q, k, v = t.pop(f"blocks.{i}.attn.qkv.{suffix}").chunk(3, 0)
            out.update({f"{layer}.{i}.{attn}.{n}_proj.{suffix}": x for n, x in zip("qkv", (q, k, v))})
    if kind == "dinov2":
        out["embeddings.cls_token"] = t.pop("cls_token")
        pos = t.pop("pos_embed")   # patches only: the cls position is already in cls_token
        out["embeddings.position_embeddings"] = torch.cat([torch.zeros_like(pos[:, :1]), pos], 1)
        out["embeddings.mask_token"] = torch.zeros(1, pos.shape[-1], dtype=pos.dtype, device=pos.device)   # unused
    else:
        out["embeddings.position_embedding.weight"] = t.pop("pos_embed")[0]
        out["head.probe"] = t.pop("attn_pool.latent")
        for s in ("weight", "bias"):
            out[f"head.attention.in_proj_{s}"] = torch.cat([t.pop(f"attn_pool.q.{s}"), t.pop(f"attn_pool.kv.{s}")], 0)
    return out


def tower_to_timm(kind: str, sd: dict[str, torch.Tensor], depth: int) -> dict[str, torch.Tensor]:
    """The inverse of `tower_from_timm`: transformers' names back to the published timm ones."""
    sd = dict(sd)
    out = {src: sd.pop(dst) for src, dst in renamed(kind, depth)}
    layer, attn = _names(kind)
    for i in range(depth):
        for suffix in ("weight", "bias"):
            out[f"blocks.{i}.attn.qkv.{suffix}"] = torch.cat([sd.pop(f"{layer}.{i}.{attn}.{n}_proj.{suffix}") for n in "qkv"], 0)
    if kind == "dinov2":
        out["cls_token"] = sd.pop("embeddings.cls_token") + sd["embeddings.position_embeddings"][:, :1]
        out["pos_embed"] = sd.pop("embeddings.position_embeddings")[:, 1:]
        sd.pop("embeddings.mask_token")
    else:
        out["pos_embed"] = sd.pop("embeddings.position_embedding.weight")[None]
        out["attn_pool.latent"] = sd.pop("head.probe")
        d = out["attn_pool.latent"].shape[-1]
        for s in ("weight", "bias"):
            w = sd.pop(f"head.attention.in_proj_{s}")
            out[f"attn_pool.q.{s}"], out[f"attn_pool.kv.{s}"] = w[:d], w[d:]
    if sd:
        raise LayoutError(f"no published name for {sorted(sd)[:8]}")
    return out


# ------------------------------------------------------------------ the model
class Prismatic(nn.Module):
    """OpenVLA's vision backbone, projector and LM, as transformers modules."""

    def __init__(self, towers: list[tuple[str, dict, dict]], llama: dict):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        self.kinds = [kind for kind, _, _ in towers]
        self.towers = nn.ModuleList(make_tower(kind, sizes, spec["heads"], spec.get("registers", 0)) for kind, sizes, spec in towers)
        self.prefix_tokens = [1 + spec.get("registers", 0) if kind == "dinov2" else 0 for kind, _, spec in towers]
        vis = sum(sizes["hidden"] for _, sizes, _ in towers)
        self.lm = LlamaForCausalLM(LlamaConfig(**llama))
        d = self.lm.config.hidden_size
        self.projector = nn.ModuleDict({"fc1": nn.Linear(vis, 4 * vis), "fc2": nn.Linear(4 * vis, d), "fc3": nn.Linear(d, d)})

    def patch_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3 * towers, H, W] pixels (each tower's own normalisation) -> [B, patches, d_lm]."""
        feats = []
        for i, (tower, skip) in enumerate(zip(self.towers, self.prefix_tokens)):
            h = tower(pixel_values=pixels[:, 3 * i:3 * i + 3], output_hidden_states=True).hidden_states[-2]
            feats.append(h[:, skip:])   # the second-to-last block's patches (registers and cls dropped)
        p = self.projector
        return p["fc3"](nn.functional.gelu(p["fc2"](nn.functional.gelu(p["fc1"](torch.cat(feats, -1))))))


def prismatic_of(cfg: dict, tensors: dict) -> Prismatic:
    """The Prismatic model a folder's config and tensors describe (random weights, right shapes)."""
    towers = []
    for tid in cfg["timm_model_ids"]:
        spec = TOWERS[tid]
        towers.append((spec["kind"], tower_sizes(tensors, PREFIX[spec["kind"]]), spec))
    llama = {**cfg.get("text_config", {}), "vocab_size": tensors["language_model.model.embed_tokens.weight"].shape[0],
             "pad_token_id": cfg.get("pad_token_id", LLAMA_VOCAB)}
    llama.pop("model_type", None)
    return Prismatic(towers, llama)


def published_state_dict(model: Prismatic) -> dict[str, torch.Tensor]:
    """The model's tensors under the released folder's names."""
    out = {}
    for kind, tower in zip(model.kinds, model.towers):
        depth = tower.config.num_hidden_layers
        out.update({PREFIX[kind] + k: v for k, v in tower_to_timm(kind, tower.state_dict(), depth).items()})
    out.update({f"projector.{k}": v for k, v in model.projector.state_dict().items()})
    out.update({f"language_model.{k}": v for k, v in model.lm.state_dict().items()})
    return out


def check_layout(skeleton: Prismatic, tensors: dict[str, torch.Tensor], where: str) -> None:
    """The folder's tensors are exactly the names and shapes `skeleton` (a model on the meta
    device: no memory) publishes, or a LayoutError naming each that differs."""
    want = {k: v.shape for k, v in published_state_dict(skeleton).items()}
    check_tensors(tensors, want, f"{where}: not the published OpenVLA layout")


def load_published(model: Prismatic, tensors: dict[str, torch.Tensor]) -> None:
    """Load released tensors (`check_layout` passed) into `model`."""
    left = dict(tensors)
    sd: dict[str, torch.Tensor] = {}
    for i, kind in enumerate(model.kinds):
        pre = PREFIX[kind]
        mine = {k[len(pre):]: left.pop(k) for k in list(left) if k.startswith(pre)}
        sd.update({f"towers.{i}.{k}": v for k, v in tower_from_timm(kind, mine, model.towers[i].config.num_hidden_layers).items()})
    sd.update({k.replace("language_model.", "lm.", 1): v for k, v in left.items()})
    model.load_state_dict(sd, strict=True)


def load_folder(folder: str | Path) -> tuple[Prismatic, dict]:
    """(model, config.json) of a released OpenVLA folder; its layout is checked before any weight is allocated."""
    folder = Path(folder)
    cfg = read_config(folder)
    tensors = read_tensors(folder)
    needed = [PREFIX[TOWERS[t]["kind"]] + n for t in cfg["timm_model_ids"] for n in ("patch_embed.proj.weight", "pos_embed",
                                                                                     "blocks.0.mlp.fc1.weight")]
    needed.append("language_model.model.embed_tokens.weight")
    if any(n not in tensors for n in needed):   # the sizes are read off these
        raise LayoutError(f"{folder}: not the published OpenVLA layout: missing {[n for n in needed if n not in tensors]}")
    with torch.device("meta"):
        check_layout(prismatic_of(cfg, tensors), tensors, str(folder))
    model = prismatic_of(cfg, tensors)
    load_published(model, tensors)
    return model, cfg


def save_folder(model: Prismatic, folder: str | Path, config: dict, shards: int = 2) -> None:
    """The released layout: config.json, model-0000i-of-0000n.safetensors + the index,
    dataset_statistics.json, preprocessor_config.json (the tokenizer files are the user's Llama-2 ones)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in sorted(published_state_dict(model).items())}
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        part = names[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, folder / fname, metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "dataset_statistics.json").write_text(json.dumps(config.get("norm_stats", {}), indent=1))
    sizes = [[3, t.config.image_size, t.config.image_size] for t in model.towers]
    (folder / "preprocessor_config.json").write_text(json.dumps({**PREPROCESSOR, "input_sizes": sizes}, indent=1))


def openvla_config(text_config: dict, norm_stats: dict) -> dict:
    """config.json as the released OpenVLA folders have it (docs/layouts/openvla-7b.md)."""
    return {"architectures": ["OpenVLAForActionPrediction"], "model_type": "openvla",
            "auto_map": {"AutoConfig": "configuration_prismatic.OpenVLAConfig",
                         "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"},
            "vision_backbone_id": "dinosiglip-vit-so-224px", "llm_backbone_id": "llama2-7b-pure",
            "arch_specifier": "no-align+fused-gelu-mlp", "use_fused_vision_backbone": True,
            "image_resize_strategy": "resize-naive", "image_sizes": [224, 224], "timm_model_ids": list(TOWERS),
            "timm_override_act_layers": [None, None], "hf_llm_id": "meta-llama/Llama-2-7b-hf", "llm_max_length": 2048,
            "pad_token_id": LLAMA_VOCAB, "pad_to_multiple_of": 64, "output_projector_states": False, "n_action_bins": 256,
            "norm_stats": norm_stats, "text_config": text_config, "torch_dtype": "bfloat16", "transformers_version": "4.40.1"}


# A tiny copy in the released layout (tests, `bench families`): the published towers' kinds and
# head counts, tiny widths and depths, 28x28 inputs (4 patches); the Llama keeps the real
# vocabulary (action tokens 31744..31999, <PAD> 32000) and shrinks its widths instead.
TINY = {"dinov2": {"hidden": 32, "depth": 3, "mlp": 128, "patch": 14, "image": 28},
        "siglip": {"hidden": 48, "depth": 3, "mlp": 80, "patch": 14, "image": 28},
        "llama": {"vocab_size": 32064, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 4, "pad_token_id": 32000}}


def tiny_model(seed: int = 0) -> Prismatic:
    """A random Prismatic at TINY sizes, with non-trivial values everywhere (layer scales,
    tokens, norms), so a load that drops or misplaces a tensor shows."""
    torch.manual_seed(seed)
    model = Prismatic([(spec["kind"], TINY[spec["kind"]], spec) for spec in TOWERS.values()], TINY["llama"])
    for p in model.parameters():
        p.data.normal_(0, 0.2)
    return model


def write_tiny_folder(folder: str | Path, norm_stats: dict, seed: int = 0) -> Prismatic:
    """A released-layout OpenVLA folder at TINY sizes, with a Llama-style tokenizer.json."""
    from .layout import write_llama_style_tokenizer

    model = tiny_model(seed)
    save_folder(model, folder, openvla_config(dict(TINY["llama"], model_type="llama"), norm_stats))
    write_llama_style_tokenizer(folder)
    return model


def published_model(device: str | torch.device = "meta") -> Prismatic:
    """openvla-7b's modules at their published sizes, random, on `device` (meta: allocating no memory)."""
    with torch.device(device):
        towers = [(spec["kind"], PUBLISHED[spec["kind"]], spec) for spec in TOWERS.values()]
        return Prismatic(towers, PUBLISHED["llama"])


# ------------------------------------------------------------------ the checkpoint's own input conventions
def read_preprocessor(folder: Path) -> dict:
    """preprocessor_config.json of the folder (a missing file is named: its means and stds are
    the checkpoint's, not ours to guess)."""
    path = Path(folder) / "preprocessor_config.json"
    if not path.is_file():
        raise FileNotFoundError(f"policy.pretrained={folder}: no preprocessor_config.json (the towers' image size, "
                                "mean and std)")
    pre = json.loads(path.read_text())
    if pre.get("image_resize_strategy") != "resize-naive" or len(pre.get("means", [])) != len(pre.get("input_sizes", [])):
        raise LayoutError(f"{path}: image_resize_strategy={pre.get('image_resize_strategy')!r}, means {pre.get('means')}: "
                          "expected resize-naive and one mean/std per tower")
    return pre


def pixels(images: torch.Tensor, pre: dict, crop: float = 1.0) -> torch.Tensor:
    """uint8 images [n, H, W, 3] (already in the orientation the checkpoint was trained on, e.g.
    LIBERO's 180-degree turn) -> [n, 3 * towers, h, w]: a centre crop keeping `crop` of the area
    (the LIBERO fine-tunes trained on random 0.9 crops and are evaluated on the centre one), then
    each tower's resize and normalisation."""
    x = images.permute(0, 3, 1, 2).float().div(255.0)
    if crop < 1.0:
        h, w = (round(d * crop ** 0.5) for d in x.shape[-2:])
        top, left = (x.shape[-2] - h) // 2, (x.shape[-1] - w) // 2
        x = x[..., top:top + h, left:left + w]
    out = []
    for (_, h, w), mean, std in zip(pre["input_sizes"], pre["means"], pre["stds"]):
        y = nn.functional.interpolate(x, size=(h, w), mode="bicubic", align_corners=False, antialias=True).clamp(0, 1)
        mean, std = (torch.tensor(v, device=x.device).view(1, 3, 1, 1) for v in (mean, std))
        out.append((y - mean) / std)
    return torch.cat(out, 1)


# ------------------------------------------------------------------ actions
def bin_centres(bins: int = 256) -> torch.Tensor:
    edges = torch.linspace(-1, 1, bins)
    return (edges[:-1] + edges[1:]) / 2


def tokens_to_actions(tokens: torch.Tensor, stats: dict, bins: int = 256) -> torch.Tensor:
    """Action token ids [..., D] -> actions in the robot's units (OpenVLA's de-tokeniser and
    un-normalisation with one `norm_stats[unnorm_key]["action"]`)."""
    idx = (LLAMA_VOCAB - tokens.long() - 1).clamp(0, bins - 2)
    a = bin_centres(bins)[idx]
    q01, q99 = (torch.tensor(stats[k], dtype=a.dtype) for k in ("q01", "q99"))
    mask = torch.tensor(stats.get("mask", [True] * len(stats["q01"])))
    return torch.where(mask, 0.5 * (a + 1) * (q99 - q01) + q01, a)


def actions_to_tokens(actions: torch.Tensor, stats: dict, bins: int = 256) -> torch.Tensor:
    """The inverse (training targets): normalise with q01/q99 where masked, then bin."""
    q01, q99 = (torch.tensor(stats[k], dtype=actions.dtype) for k in ("q01", "q99"))
    mask = torch.tensor(stats.get("mask", [True] * len(stats["q01"])))
    a = torch.where(mask, 2 * (actions - q01) / (q99 - q01).clamp_min(1e-8) - 1, actions).clamp(-1, 1)
    return LLAMA_VOCAB - torch.bucketize(a, torch.linspace(-1, 1, bins), right=True)   # numpy's digitize: 1..bins
