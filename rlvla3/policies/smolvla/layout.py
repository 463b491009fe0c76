"""SmolVLA's prompt, as LeRobot's processor writes it: the task with a newline appended (when it
has none), tokenized by SmolVLM2's tokenizer with the tokenizer's own special tokens (SmolLM2's
add none), right-padded to tokenizer_max_length (48); the ids' padding here is 0, which the
tokenizer never emits for text (SmolLM2's `<|endoftext|>`), and the model masks it. torch-free:
Simulators encode the prompt.
"""
from __future__ import annotations

from pathlib import Path

from ..prompts import CheckpointPrompt, tokenizer_folder

# config.json settings the model does not build: (key, what it must be, what is built)
UNBUILT = [("attention_mode", lambda v: v == "cross_attn", "the cross-attention expert (smolvla_base's)"),
           ("add_image_special_tokens", lambda v: not v, "no special tokens around the image tokens"),
           ("prefix_length", lambda v: v is None or v <= 0, "no padding of the prefix to a fixed length"),
           ("num_expert_layers", lambda v: v is None or v <= 0, "one expert layer per VLM layer (num_expert_layers 0 or -1)")]
MARK = "<|im_end|>"   # SmolVLM2's padding token: present in its tokenizer, a check that this is it


class SmolVLAPrompt(CheckpointPrompt):
    required_token = MARK
    tokenizer = "SmolVLM2's tokenizer (a local HuggingFaceTB/SmolVLM2-500M-Video-Instruct folder)"

    def ids(self, instruction: str) -> list[int]:
        text = instruction if instruction.endswith("\n") else instruction + "\n"
        return self.tok.encode(text).ids


def encoder(pcfg):
    """A released SmolVLA's prompt; None at random init (hashed words)."""
    return SmolVLAPrompt(tokenizer_folder(pcfg), pcfg.instruction_len) if pcfg.pretrained else None


def check_settings(cfg: dict) -> None:
    """A folder's config.json asks for nothing the model does not build (read before any rank starts)."""
    for key, ok, built in UNBUILT:
        if key in cfg and not ok(cfg[key]):
            raise ValueError(f"config.json: {key}={cfg[key]!r}; policy=smolvla builds {built}")


def check_folder(folder: str | Path) -> None:
    import json

    check_settings(json.loads((Path(folder) / "config.json").read_text()))
