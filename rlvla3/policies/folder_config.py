"""A released checkpoint folder's config.json, read and its model type checked before any rank
starts. Torch-free and numpy-free: the layouts (the launcher's checks) read it."""
from __future__ import annotations

import json
from pathlib import Path


def read_model_config(folder: str | Path, model_type: str, policy: str, what: str) -> dict:
    """`folder`'s config.json, refused unless it says `model_type` (a folder of another model
    would build the wrong one, or half of it); `what` names the released folder in the errors."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"policy.pretrained={folder}: no config.json ({what}, saved locally); nothing is downloaded")
    cfg = json.loads(path.read_text())
    if cfg.get("model_type") != model_type:
        raise ValueError(f"{path} says model_type={cfg.get('model_type')!r}: policy={policy} loads {what} "
                         f"(model_type {model_type})")
    return cfg
