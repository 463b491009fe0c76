"""GR00T N1.5's folder facts that need no torch: its embodiment, its normaliser
(`experiment_cfg/metadata.json`), its prompt (Eagle 2.5's chat template over Qwen3's tokenizer).

metadata.json: {tag: {"statistics": {"state"|"action": {subkey: {min, max, mean, std, q01, q99}}},
"modalities": {"state"|"action": {subkey: {...}}}, "embodiment_tag": tag}}. The subkeys in their
order make the state and action vectors (LIBERO: x, y, z, roll, pitch, yaw, gripper). GR00T's
LIBERO fine-tunes normalise with min/max (2 (x - min) / (max - min) - 1; a constant dim maps to 0).

The prompt, as Eagle's processor writes it for a task and K cameras:
    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n<|im_start|>user\\n
    <image 1><img>{<IMG_CONTEXT> x 256}</img> ... <image K><img>{...}</img>{task}<|im_end|>\\n<|im_start|>assistant\\n
The Simulator encodes the part after the images (`{task}<|im_end|>\\n<|im_start|>assistant\\n`,
right-padded with 0); the model puts the fixed part before it (`template`), so the prompt's
length does not carry the image tokens. Qwen3's id 0 ("!") is padding here: a prompt holding it is
refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..folder_config import read_model_config
from ..prompts import CheckpointPrompt, load_tokenizer, tokenizer_folder

EMBODIMENTS = {"new_embodiment": 31, "oxe_droid": 17, "agibot_genie1": 26, "gr1": 24}   # GR00T N1.5's tag -> weight bank row
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
TAIL = "<|im_end|>\n<|im_start|>assistant\n"
IMAGE_TOKEN = "<IMG_CONTEXT>"


def metadata(folder: str | Path) -> tuple[str, dict]:
    """(embodiment tag, its entry) of a GR00T folder's experiment_cfg/metadata.json: the folder's one tag."""
    path = Path(folder) / "experiment_cfg" / "metadata.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no experiment_cfg/metadata.json (GR00T's normalisation statistics per "
                                "embodiment, saved with every fine-tune)")
    tags = json.loads(path.read_text())
    if len(tags) != 1:
        raise ValueError(f"{path} holds {len(tags)} embodiments ({', '.join(tags)}): policy=gr00t runs a fine-tune "
                         "of one embodiment (a base checkpoint carries several and no LIBERO statistics)")
    tag, entry = next(iter(tags.items()))
    if tag not in EMBODIMENTS:
        raise ValueError(f"{path}: embodiment {tag!r} is not one GR00T N1.5 knows ({', '.join(EMBODIMENTS)})")
    return tag, entry


def min_max_affine(stats: dict, dim: int, what: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(scale, shift) of min/max normalisation over the subkeys of `stats`, concatenated in order."""
    lo = np.concatenate([np.atleast_1d(np.asarray(s["min"], np.float32)) for s in stats.values()])
    hi = np.concatenate([np.atleast_1d(np.asarray(s["max"], np.float32)) for s in stats.values()])
    if lo.shape != (dim,):
        raise ValueError(f"{source}: the {what} statistics ({', '.join(stats)}) have {lo.size} dims; this run's {what} "
                         f"has {dim}: the checkpoint was trained on another robot's layout")
    span = hi - lo
    # a constant dim: GR00T maps it to 0 and back to its value; here x - min, invertible
    scale = np.where(span > 0, 2.0 / np.where(span > 0, span, 1.0), 1.0).astype(np.float32)
    shift = np.where(span > 0, -1.0 - lo * scale, -lo).astype(np.float32)
    return scale, shift


def gripper_dims(entry: dict) -> list[int]:
    """Indices of the action's `gripper` subkey (GR00T's LIBERO data: 1 open, 0 closed)."""
    dims, start = [], 0
    for key, s in entry["statistics"]["action"].items():
        n = np.atleast_1d(s["min"]).size
        if key == "gripper":
            dims += list(range(start, start + n))
        start += n
    return dims


def template(folder: Path, cameras: int, tokens_per_image: int) -> tuple[list[int], int]:
    """The ids before the Simulator's part (system turn, user turn, each camera's image block),
    and the placeholder's id the image tokens replace."""
    tok = load_tokenizer(folder)
    image = tok.token_to_id(IMAGE_TOKEN)
    if image is None:
        raise ValueError(f"{folder}/tokenizer.json has no {IMAGE_TOKEN}: not Eagle 2.5's tokenizer (GR00T N1.5's)")
    ids: list[int] = []
    for i in range(cameras):
        head = (SYSTEM if i == 0 else "</img>") + f"<image {i + 1}><img>"
        ids += tok.encode(head, add_special_tokens=False).ids + [image] * tokens_per_image
    return ids + tok.encode("</img>", add_special_tokens=False).ids, image


class Gr00tPrompt(CheckpointPrompt):
    """The Simulator's part of GR00T's prompt: the task as given, then the end of the user turn."""

    required_token = IMAGE_TOKEN
    tokenizer = "Eagle 2.5's tokenizer (GR00T N1.5's)"

    def ids(self, instruction: str) -> list[int]:
        ids = self.tok.encode(instruction + TAIL, add_special_tokens=False).ids
        if 0 in ids:
            raise ValueError(f"the prompt of {instruction!r} holds id 0 ({self.tok.id_to_token(0)!r}), this project's padding")
        return ids


def encoder(pcfg):
    """A released GR00T's prompt; None at random init (hashed words)."""
    return Gr00tPrompt(tokenizer_folder(pcfg), pcfg.instruction_len) if pcfg.pretrained else None


def read_config(folder: str | Path) -> dict:
    """A GR00T N1.5 folder's config.json (model_type gr00t_n1_5)."""
    return read_model_config(folder, "gr00t_n1_5", "gr00t", "a GR00T N1.5 folder, e.g. nvidia/GR00T-N1.5-3B or a fine-tune")


def check_folder(folder: str | Path, proprio_dim: int, action_dim: int) -> None:
    """What a run needs of a GR00T folder, read before any rank starts: its model type, one
    embodiment with statistics of this env's sizes."""
    read_config(folder)
    _, entry = metadata(folder)
    source = f"{folder}/experiment_cfg/metadata.json"
    min_max_affine(entry["statistics"]["state"], proprio_dim, "state", source)
    min_max_affine(entry["statistics"]["action"], action_dim, "action", source)
