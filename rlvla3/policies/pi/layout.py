"""The normaliser of a LeRobot policy folder (π0, π0.5, SmolVLA fine-tunes): which features it
normalises how, and with which statistics, read from the folder's own files.

    policy_preprocessor.json   {"name": ..., "steps": [{"registry_name": ..., "config": {...}, "state_file": ...}, ...]}
    policy_preprocessor_step_{i}_normalizer_processor.safetensors     flat keys "<feature>.<stat>"
    policy_postprocessor.json / ..._unnormalizer_processor.safetensors (the same for the actions)

The normaliser step is found by its registry name, not its index (the index moved between
LeRobot versions). Its config holds `features` ({key: {"type": STATE | ACTION | VISUAL, ...}}) and
`norm_map` ({type: MEAN_STD | QUANTILES | QUANTILE10 | MIN_MAX | IDENTITY}). A base checkpoint
may carry no statistics (fine-tunes bring them): normalising then fails naming the feature.
Layout notes: docs/layouts/pi05-base.md.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..prompts import CheckpointPrompt, blind_encoder, hashed_words, tokenizer_folder

STEPS = {"policy_preprocessor": "normalizer_processor", "policy_postprocessor": "unnormalizer_processor"}
MODES = ("IDENTITY", "MEAN_STD", "MIN_MAX", "QUANTILES", "QUANTILE10")
BOUNDS = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}


@dataclass
class Normaliser:
    features: dict[str, str]                       # feature key -> its type (STATE, ACTION, VISUAL)
    norm_map: dict[str, str]                       # type -> mode
    stats: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    eps: float = 1e-8
    source: str = ""

    def mode(self, key: str) -> str:
        if key not in self.features:
            raise KeyError(f"{self.source}: the normaliser knows no feature {key!r} (it has {sorted(self.features)})")
        return self.norm_map.get(self.features[key], "IDENTITY")

    def _stat(self, key: str, name: str) -> np.ndarray:
        try:
            return self.stats[key][name]
        except KeyError:
            raise KeyError(f"{self.source}: no {name!r} statistics for {key!r} (a base checkpoint carries none; "
                           "a fine-tune's folder holds them in its normalizer step file)") from None

    def affine(self, key: str, dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scale, shift) with normalise(x) = x * scale + shift: every mode is affine per dim
        (MEAN_STD: (x - mean) / (std + eps); the bounds modes map [lo, hi] onto [-1, 1], unclipped
        as in LeRobot). `dim`: the feature's size this run has, checked against the statistics."""
        mode = self.mode(key)
        if mode == "IDENTITY":
            return np.ones(dim or 1, np.float32), np.zeros(dim or 1, np.float32)
        if mode == "MEAN_STD":
            scale = 1.0 / (self._stat(key, "std") + self.eps)
            shift = -self._stat(key, "mean") * scale
        else:
            lo, hi = (self._stat(key, s) for s in BOUNDS[mode])
            scale = 2.0 / np.maximum(hi - lo, self.eps)
            shift = -1.0 - lo * scale
        if dim is not None and scale.shape != (dim,):
            raise ValueError(f"{self.source}: the {key!r} statistics have shape {scale.shape}; this run's {key} has {dim} "
                             "dims: the checkpoint was trained on another robot's state/action layout")
        return scale.astype(np.float32), shift.astype(np.float32)

    def normalise(self, key: str, x: np.ndarray) -> np.ndarray:
        if self.mode(key) == "IDENTITY":
            return x
        scale, shift = self.affine(key)
        return x * scale + shift

    def unnormalise(self, key: str, y: np.ndarray) -> np.ndarray:
        if self.mode(key) == "IDENTITY":
            return y
        scale, shift = self.affine(key)
        return (y - shift) / scale


def read_normaliser(folder: str | Path, pipeline: str = "policy_preprocessor") -> Normaliser:
    """The normaliser step of `pipeline` in a LeRobot policy folder."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    path = folder / f"{pipeline}.json"
    if not path.is_file():
        raise FileNotFoundError(f"policy.pretrained={folder}: no {pipeline}.json (LeRobot's processor pipeline, "
                                "which holds the normaliser)")
    steps = json.loads(path.read_text()).get("steps", [])
    found = [s for s in steps if s.get("registry_name") == STEPS[pipeline]]
    if len(found) != 1:
        raise ValueError(f"{path}: {len(found)} steps named {STEPS[pipeline]!r} (steps: "
                         f"{[s.get('registry_name') or s.get('class') for s in steps]}); expected one")
    step = found[0]
    cfg = step.get("config", {})
    features = {k: v["type"] for k, v in cfg.get("features", {}).items()}
    norm_map = dict(cfg.get("norm_map", {}))
    bad = {t: m for t, m in norm_map.items() if m not in MODES}
    if bad:
        raise ValueError(f"{path}: unknown normalisation modes {bad} (known: {', '.join(MODES)})")
    stats: dict[str, dict[str, np.ndarray]] = {}
    if step.get("state_file"):
        file = folder / step["state_file"]
        if not file.is_file():
            raise FileNotFoundError(f"{path} names {step['state_file']}, which is missing from {folder}")
        for flat, value in load_file(file).items():
            key, stat = flat.rsplit(".", 1)
            stats.setdefault(key, {})[stat] = value
    return Normaliser(features, norm_map, stats, float(cfg.get("eps", 1e-8)), str(path))


def check_folder_type(folder: str | Path, family: str) -> None:
    """A released folder's config.json names its model (LeRobot's `type`, transformers'
    `model_type`): a folder of another model is refused, naming what it says (transformers'
    PI0Config would take a π0.5 folder's config and ignore the keys it does not know)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (a released {family} folder, saved locally); nothing is downloaded")
    cfg = json.loads(path.read_text())
    said = cfg.get("type", cfg.get("model_type"))
    if said != family:
        raise ValueError(f"{path} says type={said!r} (model_type={cfg.get('model_type')!r}): policy={family} loads a "
                         f"{family} folder; pick the policy its config names")


def execute_steps(folder: str | Path) -> int | None:
    """The actions of each chunk a released folder's own evaluation executes (LeRobot's
    config.json `n_action_steps`), or None where it does not say (or has no config.json, which
    the launcher's folder check names)."""
    path = Path(folder) / "config.json"
    said = json.loads(path.read_text()).get("n_action_steps") if path.is_file() else None
    return int(said) if said else None


def folder_normaliser(folder: str | Path, dims, state: bool = True) -> tuple[tuple[np.ndarray, np.ndarray],
                                                                            tuple[np.ndarray, np.ndarray]]:
    """(scale, shift) of the proprio's normalisation and of the actions' (normalised = x * scale +
    shift) from a released folder's processor pipelines, sized for `dims` (proprio_dim,
    action_dim); identity for the proprio of a model with no state token (`state` false: its
    statistics are not read) and at random init (no folder). A released folder without them is
    refused: read as identity, a raw state would enter the model and normalised actions would be
    executed as env actions (folders from openpi's PyTorch converter or RLinf carry their
    statistics elsewhere: convert them to LeRobot's processor files first)."""
    identity = lambda d: (np.ones(d, np.float32), np.zeros(d, np.float32))  # noqa: E731
    if not folder:
        return identity(dims.proprio_dim), identity(dims.action_dim)
    if not (Path(folder) / "policy_preprocessor.json").is_file():
        raise FileNotFoundError(f"{folder} has no policy_preprocessor.json: LeRobot's processor pipeline holds the "
                                "state and action statistics this checkpoint was trained with; a folder without "
                                "them (openpi's PyTorch converter, RLinf) needs its norm stats written as LeRobot's "
                                "policy_preprocessor.json/policy_postprocessor.json first")
    pre = read_normaliser(folder)
    post = read_normaliser(folder, "policy_postprocessor") if (Path(folder) / "policy_postprocessor.json").is_file() else pre
    proprio = pre.affine("observation.state", dims.proprio_dim) if state else identity(dims.proprio_dim)
    return proprio, post.affine("action", dims.action_dim)


def write_normaliser(folder: str | Path, norm: Normaliser, pipeline: str = "policy_preprocessor", index: int = 3) -> None:
    """The same files, as LeRobot writes them (tiny test folders; `index`: the step's position)."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = STEPS[pipeline]
    state_file = f"{pipeline}_step_{index}_{name}.safetensors"
    step = {"registry_name": name, "config": {"eps": norm.eps, "features": {k: {"type": t} for k, t in norm.features.items()},
                                              "norm_map": norm.norm_map}}
    if norm.stats:
        save_file({f"{k}.{s}": np.ascontiguousarray(v) for k, st in norm.stats.items() for s, v in st.items()}, folder / state_file)
        step["state_file"] = state_file
    others = [{"registry_name": f"step_{i}", "config": {}} for i in range(index)]
    (folder / f"{pipeline}.json").write_text(json.dumps({"name": pipeline, "steps": [*others, step]}, indent=1))


def clean_task(instruction: str) -> str:
    """The instruction as openpi writes it into a prompt: trimmed, underscores and newlines as spaces."""
    return instruction.strip().replace("_", " ").replace("\n", " ")


class Pi0Prompt(CheckpointPrompt):
    """π0's (openpi's tokenizer, which LeRobot's π0 follows): BOS, the cleaned instruction, then
    "\n" (PaliGemma's tokenizer; the model's prompt holds up to tokenizer_max_length 48)."""

    bos_token = "<bos>"

    def ids(self, instruction: str) -> list[int]:
        return [self.bos, *self.text_ids(clean_task(instruction)), *self.text_ids("\n")]


def pi05_text(instruction: str, state: np.ndarray | None) -> str:
    """π0.5's prompt text for a normalised state: each value cut into one of 256 bins of [-1, 1].
    Without a state, the task alone in the same frame: the random-initialised π0.5's hashed
    prompt (a released π0.5 without its state is prompted as openpi does it, π0's way: Pi05Prompt)."""
    text = clean_task(instruction)
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
    [-1, 1] (below -1: bin -1, from the last edge up: bin 255, unclipped, as openpi's digitize). It reads the state, so
    it is encoded at every step, not once per instruction. Without a state
    (policy.discrete_state_input=false, SFT's --state-dropout) the prompt is π0's, as openpi's
    tokenizer writes it when the state is off: BOS, the cleaned task, "\n" (openpi's own
    pi05_libero was trained so). `checkpoint` None: no statistics read (a base checkpoint carries
    none)."""

    bos_token = "<bos>"
    reads_state = True

    def __init__(self, folder: Path, length: int, checkpoint: str | Path | None):
        super().__init__(folder, length)
        self.norm = None
        if checkpoint is not None:
            self.norm = read_normaliser(checkpoint)
            self.norm.affine("observation.state")   # a base checkpoint without statistics fails here, naming them

    def ids(self, instruction: str, state: np.ndarray | None = None) -> list[int]:
        if state is not None and self.norm is None:
            raise ValueError("this π0.5 prompt was built without the checkpoint's state statistics "
                             "(policy.discrete_state_input=false): it writes no state")
        if state is None:
            return [self.bos, *self.text_ids(clean_task(instruction)), *self.text_ids("\n")]
        s = self.norm.normalise("observation.state", np.asarray(state, np.float32))
        return [self.bos, *self.text_ids(pi05_text(instruction, s))]

    def __call__(self, instruction: str, state: np.ndarray | None = None) -> np.ndarray:
        return self.padded(self.ids(instruction, state), instruction)


def pi0_encoder(pcfg):
    """A released π0's prompt; None at random init (hashed words)."""
    return Pi0Prompt(tokenizer_folder(pcfg), pcfg.instruction_len) if pcfg.pretrained else None


def pi05_encoder(pcfg):
    """π0.5's prompt, the state written into it unless policy.discrete_state_input=false."""
    if pcfg.pretrained:
        stats = pcfg.pretrained if pcfg.discrete_state_input else None   # the state's, needed only to write it
        encode = Pi05Prompt(tokenizer_folder(pcfg), pcfg.instruction_len, stats)
    else:
        encode = HashedPi05Prompt(pcfg.instruction_len, pcfg.vocab)
    return encode if pcfg.discrete_state_input else blind_encoder(encode)
