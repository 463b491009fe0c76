"""How an instruction becomes the int32 ids a Simulator sends (the observation's `tokens`): the
project's hashed words for families trained from scratch, or a released checkpoint's own
tokenizer and prompt template. numpy and `tokenizers` only: a Simulator rank never imports torch.

Ids are right-padded with 0 to `policy.instruction_len` (0 is padding for every family: the hashed
words start at 2, and Llama's id 0 is `<unk>`, which its byte-fallback tokenizer never emits).
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Callable

import numpy as np

# OpenVLA's prompt; the training data put SentencePiece's space token (29871) between it and the
# action tokens, and the model expects it there.
OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
OPENVLA_SPACE_TOKEN = 29871

Encoder = Callable[[str], np.ndarray]


def hashed_words(text: str, length: int, vocab: int) -> np.ndarray:
    """Instruction -> int32[length]: lower-cased words hashed (crc32, stable across processes)
    into ids 2..vocab-1; 1 = end of text, 0 = padding."""
    ids = [2 + zlib.crc32(w.encode()) % (vocab - 2) for w in text.lower().split()][: length - 1]
    out = np.zeros(length, np.int32)
    out[: len(ids)] = ids
    out[len(ids)] = 1
    return out


def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt (its training lower-cased the instruction)."""
    return OPENVLA_PROMPT.format(instruction=instruction.lower().strip())


def released_tokenizer(folder: str | Path):
    """The checkpoint folder's own tokenizer (its `tokenizer.json`, the fast-tokenizer file the
    released OpenVLA folders ship); a missing file is named, nothing is downloaded."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"policy.pretrained={folder}: no tokenizer.json (the checkpoint's Llama-2 tokenizer, "
                                "shipped in the released folder); nothing is downloaded")
    return Tokenizer.from_file(str(path))


class OpenVLAPrompt:
    """An instruction as the released OpenVLA reads it: BOS, the prompt, token 29871."""

    def __init__(self, folder: str | Path, length: int):
        self.tok, self.length, self.folder = released_tokenizer(folder), length, folder
        self.bos = self.tok.token_to_id("<s>")
        if self.bos is None:
            raise ValueError(f"policy.pretrained={folder}: its tokenizer.json has no <s> (BOS) token: not a Llama tokenizer")

    def ids(self, instruction: str) -> list[int]:
        ids = self.tok.encode(openvla_prompt(instruction)).ids
        if not ids or ids[0] != self.bos:   # tokenizer.json files differ on whether they add BOS themselves
            ids = [self.bos, *ids]
        return [*ids, OPENVLA_SPACE_TOKEN]

    def __call__(self, instruction: str) -> np.ndarray:
        ids = self.ids(instruction)
        if len(ids) > self.length:
            raise ValueError(f"the OpenVLA prompt of {instruction!r} is {len(ids)} tokens, longer than "
                             f"policy.instruction_len={self.length}: raise policy.instruction_len to at least {len(ids)}")
        out = np.zeros(self.length, np.int32)
        out[:len(ids)] = ids
        return out


def is_released_openvla(pcfg) -> bool:
    """policy=openvla with policy.pretrained: a released OpenVLA folder (the only layout the
    family loads)."""
    return pcfg.name == "openvla" and bool(pcfg.pretrained)


def instruction_encoder(pcfg) -> Encoder:
    """What turns an env's instruction into the policy's `tokens` (cached per text by the caller)."""
    if is_released_openvla(pcfg):
        return OpenVLAPrompt(pcfg.pretrained, pcfg.instruction_len)
    return lambda text: hashed_words(text, pcfg.instruction_len, pcfg.vocab)


# Text a tiny tokenizer is trained on (its merges only change how many ids a prompt takes:
# byte fallback encodes any text).
TINY_CORPUS = [OPENVLA_PROMPT.format(instruction=t) for t in (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "open the top drawer and put the bowl inside", "lift the cube", "go to the red square", "push the puck to the goal")]


def write_llama_style_tokenizer(folder: str | Path, vocab_size: int = 512) -> None:
    """A small tokenizer in the released folders' form (tokenizer.json of a byte-fallback BPE with
    SentencePiece's "▁" word marks, <unk>=0, <s>=1, </s>=2, BOS added by its post-processor;
    added_tokens.json {"<PAD>": 32000}), for tiny test checkpoints in the published layout."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(TINY_CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "added_tokens.json").write_text(json.dumps({"<PAD>": 32000}))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                                                "pad_token": "<PAD>"}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                                                              "add_eos_token": False, "model_max_length": 2048,
                                                              "padding_side": "right"}))
