"""How an instruction becomes the int32 ids a Simulator sends (the observation's `tokens`): the
project's hashed words for families trained from scratch, or a released checkpoint's own
tokenizer and prompt template. numpy and `tokenizers` only: a Simulator rank never imports torch.

An encoder is called with the instruction, and also with the env's proprio when it `reads_state`
(π0.5 writes the state into its prompt). Ids are right-padded with 0 to `policy.instruction_len`
(0 is padding for every family: the hashed words start at 2, Llama's id 0 is `<unk>`, which its
byte-fallback tokenizer never emits, and PaliGemma's is `<pad>`).
"""
from __future__ import annotations

import functools
import importlib
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from .registry import FAMILIES

Encoder = Callable[[str], np.ndarray]


def row_encoder(encode: Encoder) -> Callable[[str, np.ndarray], np.ndarray]:
    """`encode` as (instruction, proprio) -> ids, whatever the encoder: one whose prompt holds the
    state (`reads_state`) encodes every row, any other each instruction once."""
    if getattr(encode, "reads_state", False):
        return encode
    once = functools.lru_cache(maxsize=None)(encode)
    return lambda text, proprio: once(text)


def blind_encoder(encode: Encoder) -> Encoder:
    """`encode` without the state: a prompt that holds it (π0.5) written with the task alone, any
    other as it is (SFT's --state-dropout; π0.5 with policy.discrete_state_input=false)."""
    if not getattr(encode, "reads_state", False):
        return encode
    return lambda text: encode(text, None)


def hashed_words(text: str, length: int, vocab: int) -> np.ndarray:
    """Instruction -> int32[length]: lower-cased words hashed (crc32, stable across processes)
    into ids 2..vocab-1; 1 = end of text, 0 = padding."""
    ids = [2 + zlib.crc32(w.encode()) % (vocab - 2) for w in text.lower().split()][: length - 1]
    out = np.zeros(length, np.int32)
    out[: len(ids)] = ids
    out[len(ids)] = 1
    return out


def tokenizer_folder(pcfg) -> Path:
    """Where a pretrained policy's tokenizer is: policy.tokenizer, else the checkpoint folder
    (OpenVLA's ships one; LeRobot's π0 folders do not: π0 reads PaliGemma's)."""
    return Path(pcfg.tokenizer or pcfg.pretrained)


def load_tokenizer(folder: Path):
    """`tokenizer.json` of `folder` (the fast-tokenizer file); a missing file is named, nothing is downloaded."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {folder} (the checkpoint's tokenizer: a released OpenVLA folder "
                                "ships its Llama-2 one; for π0 give PaliGemma's folder as policy.tokenizer); "
                                "nothing is downloaded")
    return Tokenizer.from_file(str(path))


class CheckpointPrompt:
    """An instruction as a pretrained checkpoint reads it, right-padded with 0 to `length`."""

    bos_token = ""
    tokenizer = "this checkpoint's tokenizer"
    required_token = ""   # a token the checkpoint's tokenizer holds (its BOS unless said): the check it is that one

    def __init__(self, folder: Path, length: int):
        self.tok, self.length = load_tokenizer(folder), length
        need = self.required_token or self.bos_token
        if self.tok.token_to_id(need) is None:
            raise ValueError(f"{folder}/tokenizer.json has no {need} token: not {self.tokenizer} (policy.tokenizer)")
        self.bos = self.tok.token_to_id(self.bos_token) if self.bos_token else None

    def ids(self, instruction: str) -> list[int]:
        raise NotImplementedError

    def text_ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    reads_state = False   # the prompt depends on the instruction only (the caller may cache it per text)

    def __call__(self, instruction: str) -> np.ndarray:
        return self.padded(self.ids(instruction), instruction)

    def padded(self, ids: list[int], instruction: str) -> np.ndarray:
        if len(ids) > self.length:
            raise ValueError(f"the prompt of {instruction!r} is {len(ids)} tokens, longer than policy.instruction_len="
                             f"{self.length}: raise policy.instruction_len to at least {len(ids)}")
        out = np.zeros(self.length, np.int32)
        out[:len(ids)] = ids
        return out


def instruction_encoder(pcfg) -> Encoder:
    """What turns an env's instruction into the policy's `tokens` (cached per text by the caller):
    the family's own prompt (`registry.Family.prompt`) where it writes one for this config, else
    the project's hashed words."""
    f = FAMILIES.get(pcfg.name)
    if f and f.prompt:
        module, name = f.prompt.split(":")
        encode = getattr(importlib.import_module(f"rlvla3.policies.{module}"), name)(pcfg)
        if encode is not None:
            return encode
    return lambda text: hashed_words(text, pcfg.instruction_len, pcfg.vocab)


# Text a tiny tokenizer is trained on (its merges only change how many ids a prompt takes:
# byte fallback encodes any text).
TINY_CORPUS = [f"In: What action should the robot take to {t}?\nOut:" for t in (   # OpenVLA's prompt
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "open the top drawer and put the bowl inside", "lift the cube", "go to the red square", "push the puck to the goal")]
TINY_CORPUS.append("Task: lift the cube, State: 0 1 2 3 4 5 6 7 8 9 10 64 127 128 200 255;\nAction: ")   # π0.5's prompt


# The special tokens at the head of each vocabulary: Llama-2's (OpenVLA), PaliGemma's (π0) and
# SmolLM2's (SmolVLA's SmolVLM2).
SPECIALS = {"llama": ["<unk>", "<s>", "</s>"], "paligemma": ["<pad>", "<eos>", "<bos>", "<unk>"],
            "smolvlm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            "eagle": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<IMG_CONTEXT>", "<img>", "</img>"]}
BYTE_LEVEL = ("smolvlm", "eagle")   # SmolLM2's and Qwen3's (Eagle 2.5's) byte-level BPEs


def write_tiny_tokenizer(folder: str | Path, style: str = "llama", vocab_size: int = 512) -> None:
    """A small tokenizer.json in the form of the real ones (Llama-2's and PaliGemma's: a
    byte-fallback BPE with SentencePiece's "▁" word marks, the style's special ids first, BOS added
    by its post-processor; SmolLM2's and Qwen3's: a byte-level BPE adding no special token), for
    tiny test checkpoints; ids stay below `vocab_size`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if style in BYTE_LEVEL:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(TINY_CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS[style],
                                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                                 show_progress=False))
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok = sentencepiece_style(style, vocab_size)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))


def sentencepiece_style(style: str, vocab_size: int):
    """Llama-2's and PaliGemma's form: byte-fallback BPE, "▁" word marks, BOS by the post-processor."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = SPECIALS[style] + [f"<0x{b:02X}>" for b in range(256)]
    bos = "<s>" if style == "llama" else "<bos>"
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(TINY_CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, specials.index(bos))])
    return tok
