"""A LeRobotDataset folder (format v3.0, or v2.1) as demonstrations for SFT: `python -m rlvla3.sft
--demos <dataset folder>` reads it as it reads the project's own demonstration shards.

Read with pyarrow and PyAV, not the `lerobot` package (it pins torch and transformers against
this environment). What is read:

- `meta/info.json`: `codebase_version`, `fps`, `features`, the `data_path` / `video_path`
  templates;
- the episodes: v3.0 `meta/episodes/chunk-*/file-*.parquet` (`episode_index`, `length`, `tasks`,
  `data/chunk_index`, `data/file_index`, `dataset_from_index`, and per video key
  `videos/<key>/{chunk_index,file_index,from_timestamp}`: several episodes share one parquet and
  one mp4 file); v2.1 `meta/episodes.jsonl` (one parquet and one mp4 per episode);
- per frame (data parquet): `observation.state`, `action`, `timestamp`, `episode_index`,
  `task_index` (task strings: v3.0 `meta/tasks.parquet`, v2.1 `meta/tasks.jsonl`);
- images: a `video` feature's frame at `from_timestamp + timestamp` of its mp4 (nearest frame),
  an `image` feature's encoded bytes in the parquet.

Features map onto the env of the run's config: each env camera `c` reads
`observation.images.<c>` (or the mapping given with `--cameras c=<feature>,...`), resized to
`env.image_size` if the dataset's frames differ; `observation.state` must have `env`'s proprio
size and `action` its action size. A missing or mismatched feature stops the run before any
training, naming it and what the dataset has. Task strings become the policy's instruction tokens.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

VERSIONS = ("v3.0", "v2.1")


class DatasetError(ValueError):
    """The folder is not a LeRobotDataset this reader can map onto the run's env."""


def is_lerobot(folder: Path) -> bool:
    return (Path(folder) / "meta" / "info.json").is_file()


def read_info(folder: Path) -> dict:
    info = json.loads((Path(folder) / "meta" / "info.json").read_text())
    if info.get("codebase_version") not in VERSIONS:
        raise DatasetError(f"{folder}: LeRobotDataset codebase_version {info.get('codebase_version')!r}; "
                           f"this reader knows {', '.join(VERSIONS)}")
    return info


def camera_features(info: dict, cameras: list[str], given: dict[str, str]) -> dict[str, str]:
    """env camera -> dataset image feature."""
    images = [k for k, f in info["features"].items() if f["dtype"] in ("video", "image")]
    out = {}
    for cam in cameras:
        key = given.get(cam, f"observation.images.{cam}")
        if key not in images:
            raise DatasetError(f"env camera {cam!r} reads feature {key!r}, which the dataset does not have "
                               f"(its image features: {images}); map it with --cameras {cam}=<feature>")
        out[cam] = key
    return out


def check_vector(info: dict, key: str, size: int, what: str) -> None:
    f = info["features"].get(key)
    if f is None:
        raise DatasetError(f"the dataset has no {key!r} feature ({what}); its features: {sorted(info['features'])}")
    if list(f["shape"]) != [size]:
        raise DatasetError(f"feature {key!r} has shape {f['shape']}; the env's {what} has {size} values")


def episode_table(folder: Path, info: dict) -> list[dict]:
    """One metadata row per episode (v3.0: meta/episodes/*/*.parquet; v2.1: meta/episodes.jsonl),
    in episode order."""
    import pyarrow.parquet as pq

    folder = Path(folder)
    if info["codebase_version"] == "v2.1":
        rows = [json.loads(ln) for ln in (folder / "meta" / "episodes.jsonl").read_text().splitlines() if ln.strip()]
    else:
        files = sorted((folder / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise DatasetError(f"{folder}: no meta/episodes/chunk-*/file-*.parquet (a v3.0 dataset lists its episodes there)")
        rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: r["episode_index"])


def data_file(info: dict, ep: dict) -> str:
    """The parquet holding episode `ep`'s frames (v3.0: shared by several episodes)."""
    if info["codebase_version"] == "v2.1":
        return info["data_path"].format(episode_chunk=ep["episode_index"] // info.get("chunks_size", 1000),
                                        episode_index=ep["episode_index"])
    return info["data_path"].format(chunk_index=ep["data/chunk_index"], file_index=ep["data/file_index"])


def video_file(info: dict, ep: dict, key: str) -> tuple[str, float]:
    """(mp4 of camera `key` holding episode `ep`, the time its first frame starts there): v3.0
    concatenates episodes into one file; v2.1 has one file per episode."""
    if info["codebase_version"] == "v2.1":
        return info["video_path"].format(episode_chunk=ep["episode_index"] // info.get("chunks_size", 1000),
                                         video_key=key, episode_index=ep["episode_index"]), 0.0
    return (info["video_path"].format(video_key=key, chunk_index=ep[f"videos/{key}/chunk_index"],
                                      file_index=ep[f"videos/{key}/file_index"]),
            float(ep[f"videos/{key}/from_timestamp"]))


def task_strings(folder: Path, info: dict) -> dict[int, str]:
    folder = Path(folder)
    if info["codebase_version"] == "v2.1":
        rows = [json.loads(ln) for ln in (folder / "meta" / "tasks.jsonl").read_text().splitlines() if ln.strip()]
        return {r["task_index"]: r["task"] for r in rows}
    import pyarrow.parquet as pq

    # pandas wrote it with the task string as the index: a column "task" (or "__index_level_0__")
    t = pq.read_table(folder / "meta" / "tasks.parquet")
    name = next((c for c in ("task", "__index_level_0__") if c in t.column_names), None)
    if name is None:
        raise DatasetError(f"{folder}/meta/tasks.parquet: no task strings (columns {t.column_names})")
    return dict(zip(t.column("task_index").to_pylist(), t.column(name).to_pylist()))


def column(table, key: str) -> np.ndarray:
    """A parquet column as numpy: [n] for scalars, [n, d] for (fixed-size) lists of numbers."""
    col = table.column(key).combine_chunks()
    if hasattr(col, "flatten"):
        return np.asarray(col.flatten()).reshape(len(col), -1)
    return np.asarray(col)


class VideoFrames:
    """Frames of a dataset's mp4 files at given times; one decoded file held at a time (the
    episodes of a v3.0 file come one after another)."""

    def __init__(self, folder: Path, fps: float):
        self.folder, self.fps = Path(folder), fps
        self.held: tuple[str, np.ndarray, np.ndarray] | None = None   # (file, stamps, frames)

    def at(self, rel: str, times: np.ndarray) -> np.ndarray:
        """Frames [n, H, W, 3] nearest to `times` (seconds into the file)."""
        from .videos import read_mp4

        if self.held is None or self.held[0] != rel:
            self.held = (rel, *read_mp4(self.folder / rel))
        _, stamps, frames = self.held
        idx = np.abs(stamps[None, :] - np.asarray(times)[:, None]).argmin(1)
        worst = np.abs(stamps[idx] - times).max()
        if worst > 0.5 / self.fps:
            raise DatasetError(f"{rel}: no frame within half a frame of t={times[np.abs(stamps[idx] - times).argmax()]:.3f}s "
                               f"(nearest {worst:.3f}s away); its timestamps and the episode's do not match")
        return frames[idx]


def decode_image(cell) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))


def fit(frames: np.ndarray, size: int) -> np.ndarray:
    """Frames [n, H, W, 3] at the env's square image size (area resampling, as a camera downscale)."""
    if frames.shape[1:3] == (size, size):
        return frames
    import cv2

    return np.stack([cv2.resize(f, (size, size), interpolation=cv2.INTER_AREA) for f in frames])


def load_lerobot(folder: Path, cfg, cameras: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Every frame of a LeRobotDataset mapped onto `cfg.env`, episode after episode: images
    [R, cams, S, S, 3] uint8, proprio [R, P], tokens [R, L], actions [R, D] (one step each) and
    ended [R] (an episode's last frame), as `sft.load_demos` reads them from shards."""
    import pyarrow.parquet as pq

    from ..envs import env_dims
    from ..policies.prompts import instruction_encoder

    folder = Path(folder)
    info = read_info(folder)
    dims = env_dims(cfg)
    cams = camera_features(info, list(cfg.env.cameras)[:dims.cameras], cameras or {})
    check_vector(info, "observation.state", dims.proprio_dim, "proprio")
    check_vector(info, "action", dims.action_dim, "action")
    tasks = task_strings(folder, info)
    encode = instruction_encoder(cfg.policy)
    videos = VideoFrames(folder, info["fps"])
    parts = {k: [] for k in ("images", "proprio", "tokens", "actions", "ended")}
    held: tuple[str, object] | None = None   # one data file at a time
    for ep in episode_table(folder, info):
        data = data_file(info, ep)
        if held is None or held[0] != data:
            held = (data, pq.read_table(folder / data))
        table = held[1]
        mine = np.flatnonzero(column(table, "episode_index") == ep["episode_index"])
        order = "frame_index" if "frame_index" in table.column_names else "timestamp"
        mine = mine[np.argsort(column(table, order)[mine], kind="stable")]
        if len(mine) != ep["length"]:
            raise DatasetError(f"episode {ep['episode_index']}: {len(mine)} rows in {data}, its metadata says {ep['length']}")
        rows = table.take(mine)
        proprio = column(rows, "observation.state").astype(np.float32)
        views = []
        for cam, key in cams.items():
            if info["features"][key]["dtype"] == "video":
                rel, start = video_file(info, ep, key)
                frames = videos.at(rel, start + column(rows, "timestamp").astype(np.float64))
            else:
                frames = np.stack([decode_image(c) for c in rows.column(key).to_pylist()])
            views.append(fit(frames, cfg.env.image_size))
        text = [tasks[int(i)] for i in column(rows, "task_index")]
        reads_state = getattr(encode, "reads_state", False)
        parts["tokens"].append(np.stack([encode(s, p) if reads_state else encode(s) for s, p in zip(text, proprio)]))
        parts["images"].append(np.stack(views, axis=1))
        parts["proprio"].append(proprio)
        parts["actions"].append(column(rows, "action").astype(np.float32))
        ended = np.zeros(len(rows), bool)
        ended[-1] = True
        parts["ended"].append(ended)
    return {k: np.concatenate(v) for k, v in parts.items()}
