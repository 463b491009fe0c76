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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

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
