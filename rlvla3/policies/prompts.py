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
import re
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

# OpenVLA's prompt; the training data put SentencePiece's space token (29871) between it and the
# action tokens, and the model expects it there.
OPENVLA_PROMPT = "In: What action should the robot take to {instruction}?\nOut:"
OPENVLA_SPACE_TOKEN = 29871

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


def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt (its training lower-cased the instruction)."""
    return OPENVLA_PROMPT.format(instruction=instruction.lower().strip())


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

    def __init__(self, folder: Path, length: int):
        self.tok, self.length = load_tokenizer(folder), length
        self.bos = self.tok.token_to_id(self.bos_token)
        if self.bos is None:
            raise ValueError(f"{folder}/tokenizer.json has no {self.bos_token} (BOS) token: not this checkpoint's tokenizer")

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


class OpenVLAPrompt(CheckpointPrompt):
    """The released OpenVLA's: BOS, the prompt, token 29871."""

    bos_token = "<s>"

    def ids(self, instruction: str) -> list[int]:
        return [self.bos, *self.text_ids(openvla_prompt(instruction)), OPENVLA_SPACE_TOKEN]


class Pi0Prompt(CheckpointPrompt):
    """π0's (openpi's tokenizer, which LeRobot's π0 follows): BOS, the cleaned instruction, then
    "\n" (PaliGemma's tokenizer; the model's prompt holds up to tokenizer_max_length 48)."""

    bos_token = "<bos>"

    def ids(self, instruction: str) -> list[int]:
        text = instruction.strip().replace("_", " ").replace("\n", " ")
        return [self.bos, *self.text_ids(text), *self.text_ids("\n")]


def pi05_text(instruction: str, state: np.ndarray | None) -> str:
    """π0.5's prompt text for a normalised state: each value cut into one of 256 bins of [-1, 1].
    Without a state (SFT's --state-dropout, policy.discrete_state_input=false), the task alone."""
    text = instruction.strip().replace("_", " ").replace("\n", " ")
    if state is None:
        return f"Task: {text};\nAction: "
    bins = np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1
    return f"Task: {text}, State: {' '.join(map(str, bins))};\nAction: "


# SentencePiece's word mark: PaliGemma's tokenizer writes " 130" as the mark and one piece per digit.
WORD_MARK = "\u2581"


def pi05_words(text: str) -> list[str]:
    """π0.5's prompt text as the words a random-initialised π0.5 embeds: a word holding a number
    becomes the word mark and its digits (and any other characters) one by one, as PaliGemma's
    tokenizer (split_digits) writes it. A whole bin as one word would be 256 words of which a few
    demonstrations train a handful: a state a few millimetres outside them would read as untrained
    embeddings (docs/results/libero.md); ten digits are all trained by any state."""
    words = []
    for w in text.split():
        words += [WORD_MARK, *re.findall(r"\d|\D+", w)] if any(c.isdigit() for c in w) else [w]
    return words


def hashed_pi05_min_length(proprio_dim: int) -> int:
    """The shortest policy.instruction_len a HashedPi05Prompt can hold whatever the state: "Task:",
    one instruction word, "State:", up to 4 words per value (the mark and 3 digits, or the mark,
    "-" and "1"), the ";" split off the last, "Action:" and the end id."""
    return 4 * proprio_dim + 6


class HashedPi05Prompt:
    """A random-initialised π0.5's prompt: π0.5's text, state included, as the project's hashed
    words (no tokenizer, no statistics: the raw proprio is binned; LIBERO's end-effector position
    spans 20-70 bins, its gripper a few). Without it the state would reach the model nowhere
    (π0.5 has no state token). Numbers are split into digits as PaliGemma's tokenizer splits them
    (pi05_words): a bin no demonstration reached still reads as trained words. A prompt longer
    than `length` fails, naming policy.instruction_len, instead of losing the state at its end."""

    reads_state = True

    def __init__(self, length: int, vocab: int):
        self.length, self.vocab = length, vocab

    def __call__(self, instruction: str, state: np.ndarray | None = None) -> np.ndarray:
        words = pi05_words(pi05_text(instruction, None if state is None else np.asarray(state, np.float32)))
        if len(words) >= self.length:   # hashed_words keeps length - 1 words and the end id
            raise ValueError(f"policy.instruction_len={self.length} cuts π0.5's prompt of {len(words)} words "
                             f"({' '.join(words)!r}): give at least {len(words) + 1}")
        return hashed_words(" ".join(words), self.length, self.vocab)


class Pi05Prompt(CheckpointPrompt):
    """π0.5's: BOS, "Task: {instruction}, State: {bins};\nAction: ", where the proprio is normalised
    with the folder's state statistics (LeRobot's normaliser: quantiles) and cut into 256 bins of
    [-1, 1] (below -1: bin -1, above 1: bin 256, unclipped, as openpi does). It reads the state, so
    it is encoded at every step, not once per instruction. `checkpoint` None: the task alone, no
    statistics read (policy.discrete_state_input=false: a base checkpoint carries none)."""

    bos_token = "<bos>"
    reads_state = True

    def __init__(self, folder: Path, length: int, checkpoint: str | Path | None):
        from .lerobot_io import read_normaliser

        super().__init__(folder, length)
        self.norm = None
        if checkpoint is not None:
            self.norm = read_normaliser(checkpoint)
            self.norm.affine("observation.state")   # a base checkpoint without statistics fails here, naming them

    def ids(self, instruction: str, state: np.ndarray | None = None) -> list[int]:
        if state is not None and self.norm is None:
            raise ValueError("this π0.5 prompt was built without the checkpoint's state statistics "
                             "(policy.discrete_state_input=false): it writes no state")
        s = None if state is None else self.norm.normalise("observation.state", np.asarray(state, np.float32))
        return [self.bos, *self.text_ids(pi05_text(instruction, s))]

    def __call__(self, instruction: str, state: np.ndarray | None = None) -> np.ndarray:
        return self.padded(self.ids(instruction, state), instruction)


def is_released_openvla(pcfg) -> bool:
    """policy=openvla or openvla_oft with policy.pretrained: a released OpenVLA (or OFT) folder,
    the only layout these families load."""
    return pcfg.name in ("openvla", "openvla_oft") and bool(pcfg.pretrained)


def instruction_encoder(pcfg) -> Encoder:
    """What turns an env's instruction into the policy's `tokens` (cached per text by the caller)."""
    if is_released_openvla(pcfg):
        return OpenVLAPrompt(tokenizer_folder(pcfg), pcfg.instruction_len)
    if pcfg.name == "pi0" and pcfg.pretrained:
        return Pi0Prompt(tokenizer_folder(pcfg), pcfg.instruction_len)
    if pcfg.name == "pi05":
        if pcfg.pretrained:
            stats = pcfg.pretrained if pcfg.discrete_state_input else None   # the state's, needed only to write it
            encode = Pi05Prompt(tokenizer_folder(pcfg), pcfg.instruction_len, stats)
        else:
            encode = HashedPi05Prompt(pcfg.instruction_len, pcfg.vocab)
        return encode if pcfg.discrete_state_input else blind_encoder(encode)
    return lambda text: hashed_words(text, pcfg.instruction_len, pcfg.vocab)


# Text a tiny tokenizer is trained on (its merges only change how many ids a prompt takes:
# byte fallback encodes any text).
TINY_CORPUS = [OPENVLA_PROMPT.format(instruction=t) for t in (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "open the top drawer and put the bowl inside", "lift the cube", "go to the red square", "push the puck to the goal")]
TINY_CORPUS.append("Task: lift the cube, State: 0 1 2 3 4 5 6 7 8 9 10 64 127 128 200 255;\nAction: ")   # π0.5's prompt


# The special tokens at the head of each vocabulary: Llama-2's (OpenVLA) and PaliGemma's (π0).
SPECIALS = {"llama": ["<unk>", "<s>", "</s>"], "paligemma": ["<pad>", "<eos>", "<bos>", "<unk>"]}


def write_tiny_tokenizer(folder: str | Path, style: str = "llama", vocab_size: int = 512) -> None:
    """A small tokenizer.json in the form of the real ones (a byte-fallback BPE with
    SentencePiece's "▁" word marks, the style's special ids first, BOS added by its post-processor),
    for tiny test checkpoints; ids stay below `vocab_size`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = SPECIALS[style] + [f"<0x{b:02X}>" for b in range(256)]
    bos = "<s>" if style == "llama" else "<bos>"
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(TINY_CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, specials.index(bos))])
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))


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
