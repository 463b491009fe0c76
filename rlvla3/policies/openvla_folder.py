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

from .prompts import load_tokenizer, tokenizer_folder

FILES = ("config.json", "preprocessor_config.json")


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"policy.pretrained={folder}: no config.json (a released OpenVLA folder, e.g. "
                                "openvla/openvla-7b, saved locally); nothing is downloaded")
    cfg = json.loads(path.read_text())
    if cfg.get("model_type") != "openvla":
        raise ValueError(f"{path}: model_type={cfg.get('model_type')!r}; policy=openvla loads a released OpenVLA folder "
                         "(model_type openvla)")
    return cfg


def action_stats(cfg: dict, unnorm_key: str, action_dim: int, where: str = "") -> dict:
    """The action statistics that un-normalise this run's actions: `norm_stats[unnorm_key]` (or
    the folder's only dataset when unnorm_key is empty), with `action_dim` dims."""
    stats = cfg.get("norm_stats") or {}
    if not unnorm_key:
        if len(stats) != 1:
            raise ValueError(f"{where}config.json has norm_stats for {sorted(stats)}: set policy.unnorm_key to the dataset "
                             "whose action statistics this env's actions follow")
        unnorm_key = next(iter(stats))
    if unnorm_key not in stats or "action" not in stats[unnorm_key]:
        raise ValueError(f"policy.unnorm_key={unnorm_key!r} is not among the folder's norm_stats {sorted(stats)}")
    action = stats[unnorm_key]["action"]
    if len(action["q01"]) != action_dim:
        raise ValueError(f"norm_stats[{unnorm_key!r}] has {len(action['q01'])}-D actions; this env's actions are "
                         f"{action_dim}-D: pick a checkpoint (or policy.unnorm_key) trained on this robot's action space")
    return {"q01": action["q01"], "q99": action["q99"], "mask": action.get("mask", [True] * action_dim)}


def check(pcfg, action_dim: int) -> None:
    """policy.pretrained is a released OpenVLA folder this run can use; raises ValueError naming
    the file or value that is not."""
    folder = Path(pcfg.pretrained)
    for name in FILES:
        if not (folder / name).is_file():
            raise FileNotFoundError(f"policy.pretrained={folder}: no {name} (a released OpenVLA folder has "
                                    f"{', '.join(FILES)}, tokenizer.json and model*.safetensors)")
    load_tokenizer(tokenizer_folder(pcfg))
    cfg = read_config(folder)
    action_stats(cfg, pcfg.unnorm_key, action_dim, f"{folder}/")
    if cfg.get("n_action_bins", 256) != pcfg.action_bins:
        raise ValueError(f"policy.action_bins={pcfg.action_bins}, but {folder}/config.json has n_action_bins="
                         f"{cfg.get('n_action_bins')}: set policy.action_bins={cfg.get('n_action_bins')}")
