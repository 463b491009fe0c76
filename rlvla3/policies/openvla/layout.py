"""What a released OpenVLA folder says about its inputs and outputs, read without torch (the
launcher checks it before any rank starts; docs/layouts/openvla-7b.md lists the files).

- `norm_stats[unnorm_key]["action"]`: q01/q99 and the mask of the dims they un-normalise (the
  gripper is the one dim left out in every OpenVLA dataset);
- `n_action_bins` (256): the sample's bins, LM tokens 31999 - b;
- the tokenizer (`tokenizer.json`, or policy.tokenizer's) and the towers' image transform
  (`preprocessor_config.json`).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..folder_config import read_model_config
from ..prompts import CheckpointPrompt, load_tokenizer, tokenizer_folder, write_tiny_tokenizer

FILES = ("config.json", "preprocessor_config.json")


def read_config(folder: str | Path) -> dict:
    return read_model_config(folder, "openvla", "openvla", "a released OpenVLA folder, e.g. openvla/openvla-7b")


def norm_stats(folder: str | Path, cfg: dict) -> dict:
    """The folder's dataset statistics: `dataset_statistics.json` (what the released evaluation
    scripts read; an OFT fine-tune's config.json may keep the base model's) or config.json's."""
    path = Path(folder) / "dataset_statistics.json"
    return json.loads(path.read_text()) if path.is_file() else (cfg.get("norm_stats") or {})


def dataset_entry(stats: dict, unnorm_key: str, where: str = "") -> tuple[str, dict]:
    """(key, statistics) of `unnorm_key`, or of the folder's only dataset when it is empty."""
    if not unnorm_key:
        if len(stats) != 1:
            raise ValueError(f"{where}norm_stats for {sorted(stats)}: set policy.unnorm_key to the dataset "
                             "whose action statistics this env's actions follow")
        unnorm_key = next(iter(stats))
    if unnorm_key not in stats or "action" not in stats[unnorm_key]:
        raise ValueError(f"policy.unnorm_key={unnorm_key!r} is not among the folder's norm_stats {sorted(stats)}")
    return unnorm_key, stats[unnorm_key]


def bounds(entry: dict, part: str, key: str, dim: int) -> dict:
    """q01/q99 and the mask of the dims they apply to, of `part` (action or proprio), with `dim` dims."""
    if part not in entry:
        raise ValueError(f"norm_stats[{key!r}] has no {part!r} statistics (it has {sorted(entry)})")
    st = entry[part]
    if len(st["q01"]) != dim:
        raise ValueError(f"norm_stats[{key!r}] has {len(st['q01'])}-D {part}; this env's {part} is {dim}-D: pick a "
                         f"checkpoint (or policy.unnorm_key) trained on this robot's {part} layout")
    return {"q01": st["q01"], "q99": st["q99"], "mask": st.get("mask", [True] * dim)}


def gripper_to_env(a: np.ndarray) -> np.ndarray:
    """OpenVLA's LIBERO datasets' gripper (1 open, 0 closed) -> the envs' sign (-1 open, +1
    closed), as OpenVLA's and OFT's LIBERO evaluations map it: 2a - 1, its sign, inverted. Exactly
    0.5 gives 0 there (the sign of 0), so it does here: the gripper holds still."""
    return -np.sign(2.0 * np.asarray(a, np.float64) - 1.0)


def gripper_to_dataset(g: np.ndarray) -> np.ndarray:
    """The inverse of gripper_to_env: the envs' sign -> 1 open, 0 closed."""
    return np.where(g < 0, 1.0, 0.0)


def unit_bounds(dim: int) -> dict:
    """Statistics that leave [-1, 1] as it is (a published configuration without its folder)."""
    return {"q01": [-1.0] * dim, "q99": [1.0] * dim, "mask": [True] * dim}


def action_stats(stats: dict, unnorm_key: str, action_dim: int, where: str = "") -> dict:
    """The action statistics that un-normalise this run's actions."""
    key, entry = dataset_entry(stats, unnorm_key, where)
    return bounds(entry, "action", key, action_dim)


OFT_MODULES = ("action_head", "proprio_projector")   # <name>--<step>_checkpoint.pt beside an OFT folder's weights


def check(pcfg, action_dim: int, proprio_dim: int) -> None:
    """policy.pretrained is a released OpenVLA (openvla_oft: OpenVLA-OFT) folder this run can use;
    raises ValueError naming the file or value that is not."""
    folder = Path(pcfg.pretrained)
    for name in FILES:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"policy.pretrained={folder}: no {name} (a released OpenVLA folder has "
                                    f"{', '.join(FILES)}, tokenizer.json and model*.safetensors)")
    load_tokenizer(tokenizer_folder(pcfg))
    cfg = read_config(folder)
    stats = norm_stats(folder, cfg)
    action_stats(stats, pcfg.unnorm_key, action_dim, f"{folder}: ")
    if pcfg.name == "openvla_oft":
        for name in OFT_MODULES:
            if len(list(folder.glob(f"{name}--*_checkpoint.pt"))) != 1:
                raise FileNotFoundError(f"policy.pretrained={folder}: no single {name}--<step>_checkpoint.pt "
                                        "(a released OpenVLA-OFT folder has its action head and proprio projector)")
        key, entry = dataset_entry(stats, pcfg.unnorm_key)
        bounds(entry, "proprio", key, proprio_dim)
    if pcfg.name == "openvla" and cfg.get("n_action_bins", 256) != pcfg.action_bins:   # OFT's head needs no bins
        raise ValueError(f"policy.action_bins={pcfg.action_bins}, but {folder}/config.json has n_action_bins="
                         f"{cfg.get('n_action_bins')}: set policy.action_bins={cfg.get('n_action_bins')}")


# OpenVLA's prompt; the training data put SentencePiece's space token (29871) between it and the
# action tokens, and the model expects it there.
OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
OPENVLA_SPACE_TOKEN = 29871


def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt (its training lower-cased the instruction)."""
    return OPENVLA_PROMPT.format(instruction=instruction.lower().strip())


class OpenVLAPrompt(CheckpointPrompt):
    """The released OpenVLA's: BOS, the prompt, token 29871."""

    bos_token = "<s>"

    def ids(self, instruction: str) -> list[int]:
        return [self.bos, *self.text_ids(openvla_prompt(instruction)), OPENVLA_SPACE_TOKEN]


def is_released_openvla(pcfg) -> bool:
    """policy=openvla or openvla_oft with policy.pretrained: a released OpenVLA (or OFT) folder,
    the only layout these families load."""
    return pcfg.name in ("openvla", "openvla_oft") and bool(pcfg.pretrained)


def encoder(pcfg):
    """The released checkpoint's prompt; None for the random-initialised family (hashed words)."""
    return OpenVLAPrompt(tokenizer_folder(pcfg), pcfg.instruction_len) if is_released_openvla(pcfg) else None


def write_llama_style_tokenizer(folder: str | Path) -> None:
    """The tokenizer files of a released OpenVLA folder, tiny (added_tokens.json {"<PAD>": 32000})."""
    import json

    write_tiny_tokenizer(folder, "llama")
    folder = Path(folder)
    (folder / "added_tokens.json").write_text(json.dumps({"<PAD>": 32000}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                                                "pad_token": "<PAD>"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                                                              "add_eos_token": False, "model_max_length": 2048,
                                                              "padding_side": "right"}))
