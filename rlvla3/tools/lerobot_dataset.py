"""A LeRobotDataset folder (format v3.0, or v2.1) as demonstrations for SFT: `python -m rlvla3.sft
--demos <dataset folder>` reads it as it reads the project's own demonstration shards. And out:
`LeRobotWriter` writes v3.0, `export_run` a run's recorded episodes (`collect --format lerobot`,
`evaluate --lerobot`).

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


def crop(frames: np.ndarray, feature: dict) -> np.ndarray:
    """Decoded frames cut to the feature's height and width: an encoder pads odd sides to even
    ones (yuv420p), so a 21x21 camera comes back 22x22."""
    names, shape = feature.get("names") or ["height", "width", "channels"], feature["shape"]
    if "height" not in names or "width" not in names:
        return frames
    return frames[:, :shape[names.index("height")], :shape[names.index("width")]]


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
    from ..policies.prompts import instruction_encoder, row_encoder

    folder = Path(folder)
    info = read_info(folder)
    dims = env_dims(cfg)
    cams = camera_features(info, list(cfg.env.cameras)[:dims.cameras], cameras or {})
    check_vector(info, "observation.state", dims.proprio_dim, "proprio")
    check_vector(info, "action", dims.action_dim, "action")
    tasks = task_strings(folder, info)
    encode = row_encoder(instruction_encoder(cfg.policy))
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
                frames = crop(videos.at(rel, start + column(rows, "timestamp").astype(np.float64)), info["features"][key])
            else:
                frames = np.stack([decode_image(c) for c in rows.column(key).to_pylist()])
            views.append(fit(frames, cfg.env.image_size))
        text = [tasks[int(i)] for i in column(rows, "task_index")]
        parts["tokens"].append(np.stack([encode(s, p) for s, p in zip(text, proprio)]))
        parts["images"].append(np.stack(views, axis=1))
        parts["proprio"].append(proprio)
        parts["actions"].append(column(rows, "action").astype(np.float32))
        ended = np.zeros(len(rows), bool)
        ended[-1] = True
        parts["ended"].append(ended)
    return {k: np.concatenate(v) for k, v in parts.items()}


# ---------------------------------------------------------------- out: writing a v3.0 dataset
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
INT_INDEX = ("frame_index", "episode_index", "index", "task_index")   # int64 columns of every frame
INDEX_FEATURES = ("timestamp", *INT_INDEX)


def vector_feature(dtype: str, size: int, prefix: str) -> dict:
    return {"dtype": dtype, "shape": [size], "names": [f"{prefix}_{i}" for i in range(size)]}


def video_feature(height: int, width: int, fps: int, codec: str) -> dict:
    """The camera's frames are [height, width]; the file's, padded to even sides (yuv420p), are
    what "video.height" / "video.width" say."""
    return {"dtype": "video", "shape": [height, width, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": height + height % 2, "video.width": width + width % 2, "video.codec": codec,
                     "video.pix_fmt": "yuv420p",
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False}}


class RunningStats:
    """min, max, mean, std and count of a feature over every frame written, as meta/stats.json
    keeps them (images: per channel, in [0, 1], shaped [3, 1, 1])."""

    def __init__(self):
        self.n, self.sum, self.sq, self.lo, self.hi = 0, 0.0, 0.0, None, None

    def add(self, x: np.ndarray) -> None:
        """x [n, ...values]: reduced over every axis but the last."""
        x = x.reshape(-1, x.shape[-1]).astype(np.float64)
        self.n += len(x)
        self.sum, self.sq = self.sum + x.sum(0), self.sq + (x * x).sum(0)
        lo, hi = x.min(0), x.max(0)
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)

    def to_json(self, shape=None) -> dict:
        mean = self.sum / self.n
        std = np.sqrt(np.maximum(self.sq / self.n - mean * mean, 0.0))
        out = {"min": self.lo, "max": self.hi, "mean": mean, "std": std}
        return {**{k: (v.reshape(shape) if shape else v).tolist() for k, v in out.items()}, "count": [self.n]}


class LeRobotWriter:
    """A LeRobotDataset v3.0 folder written episode by episode (`add_episode`), finished by
    `close`: every frame in one data parquet, each camera's frames one after another in one mp4
    (`observation.images.<camera>`, H.264), the episodes' rows in meta/episodes, the task strings in
    meta/tasks.parquet, meta/info.json and meta/stats.json. Frames are what the env gave the policy
    (one per env step), actions the env actions in [-1, 1]; `next.reward`, `next.done` and
    `next.success` keep what the step returned. Held in memory: the tabular rows, never the frames."""

    def __init__(self, folder: Path, cameras: list[str], fps: int, robot_type: str = ""):
        from .videos import Mp4Writer

        self.folder, self.cameras, self.fps, self.robot_type = Path(folder), list(cameras), int(fps), robot_type
        if (self.folder / "meta" / "info.json").exists():
            raise DatasetError(f"{self.folder}: a dataset is already there (meta/info.json); choose another folder")
        self.keys = [f"observation.images.{c}" for c in self.cameras]
        self.videos = {}
        for key in self.keys:
            path = self.folder / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.videos[key] = Mp4Writer(path, self.fps)
        self.rows: dict[str, list] = {k: [] for k in ("observation.state", "action", "next.reward", "next.done",
                                                      "next.success", *INDEX_FEATURES)}
        self.episodes: list[dict] = []
        self.tasks: dict[str, int] = {}
        self.stats = {k: RunningStats() for k in ("observation.state", "action", "next.reward", *self.keys)}
        self.shape: tuple[int, int, int, int] | None = None   # (H, W, state size, action size)

    def add_episode(self, images: np.ndarray, state: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                    success: bool, task: str) -> None:
        """images [T, cams, H, W, 3] uint8, state [T, P], actions [T, D], rewards [T]; `success`:
        the episode reached its goal (on its last frame)."""
        T = len(images)
        if images.shape[1] != len(self.keys):
            raise DatasetError(f"episode {len(self.episodes)}: {images.shape[1]} camera image(s), the dataset has "
                               f"{len(self.keys)} ({self.keys})")
        shape = (images.shape[2], images.shape[3], state.shape[1], actions.shape[1])
        if self.shape is not None and shape != self.shape:
            raise DatasetError(f"episode {len(self.episodes)}: (H, W, state, action) sizes {shape} differ from the "
                               f"dataset's {self.shape}")
        self.shape = shape
        first, start = len(self.rows["index"]), self.videos[self.keys[0]].frames if self.keys else 0
        task_index = self.tasks.setdefault(task, len(self.tasks))
        done = np.arange(T) == T - 1
        for k, v in (("observation.state", state), ("action", actions), ("next.reward", rewards[:, None])):
            self.stats[k].add(v)
        self.rows["observation.state"] += state.astype(np.float32).tolist()
        self.rows["action"] += actions.astype(np.float32).tolist()
        self.rows["next.reward"] += rewards.astype(np.float32).tolist()
        self.rows["next.done"] += done.tolist()
        self.rows["next.success"] += (done & success).tolist()
        self.rows["timestamp"] += (np.arange(T) / self.fps).astype(np.float32).tolist()
        self.rows["frame_index"] += list(range(T))
        self.rows["episode_index"] += [len(self.episodes)] * T
        self.rows["index"] += list(range(first, first + T))
        self.rows["task_index"] += [task_index] * T
        ep = {"episode_index": len(self.episodes), "tasks": [task], "length": T,
              "data/chunk_index": 0, "data/file_index": 0, "dataset_from_index": first, "dataset_to_index": first + T,
              "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        for c, key in enumerate(self.keys):
            frames = images[:, c]
            self.videos[key].add(frames)
            self.stats[key].add(frames[::max(1, T // 8)] / 255.0)   # a few frames an episode: channel statistics
            ep.update({f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                       f"videos/{key}/from_timestamp": start / self.fps, f"videos/{key}/to_timestamp": (start + T) / self.fps})
        self.episodes.append(ep)

    def close(self) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for w in self.videos.values():
            w.close()
        if not self.episodes:
            raise DatasetError(f"{self.folder}: no whole episode to write")
        h, w, p, d = self.shape
        r = self.rows
        data = self.folder / DATA_PATH.format(chunk_index=0, file_index=0)
        data.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({
            "observation.state": pa.array(r["observation.state"], pa.list_(pa.float32(), p)),
            "action": pa.array(r["action"], pa.list_(pa.float32(), d)),
            "next.reward": pa.array(r["next.reward"], pa.float32()), "next.done": pa.array(r["next.done"], pa.bool_()),
            "next.success": pa.array(r["next.success"], pa.bool_()), "timestamp": pa.array(r["timestamp"], pa.float32()),
            **{k: pa.array(r[k], pa.int64()) for k in INT_INDEX}}), data)
        meta = self.folder / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        meta.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(self.episodes), meta)
        pq.write_table(pa.table({"task_index": pa.array(list(self.tasks.values()), pa.int64()), "task": list(self.tasks)}),
                       self.folder / "meta" / "tasks.parquet")
        stats = {k: s.to_json([3, 1, 1] if k in self.keys else None) for k, s in self.stats.items()}
        (self.folder / "meta" / "stats.json").write_text(json.dumps(stats, indent=1))
        (self.folder / "meta" / "info.json").write_text(json.dumps(self.info(h, w, p, d), indent=2))
        return self.folder

    def info(self, h: int, w: int, p: int, d: int) -> dict:
        scalar = {"shape": [1], "names": None}
        features = {**{k: video_feature(h, w, self.fps, "h264") for k in self.keys},
                    "observation.state": vector_feature("float32", p, "state"),
                    "action": vector_feature("float32", d, "action"),
                    "next.reward": {"dtype": "float32", **scalar}, "next.done": {"dtype": "bool", **scalar},
                    "next.success": {"dtype": "bool", **scalar}, "timestamp": {"dtype": "float32", **scalar},
                    **{k: {"dtype": "int64", **scalar} for k in INT_INDEX}}
        n = len(self.rows["index"])
        return {"codebase_version": "v3.0", "robot_type": self.robot_type or None, "total_episodes": len(self.episodes),
                "total_frames": n, "total_tasks": len(self.tasks), "chunks_size": 1000, "data_files_size_in_mb": 100,
                "video_files_size_in_mb": 500, "fps": self.fps, "splits": {"train": f"0:{len(self.episodes)}"},
                "data_path": DATA_PATH, "video_path": VIDEO_PATH, "features": features}


def export_run(run_dir: Path, out: Path, cfg, versions: int | None = None) -> tuple[int, int]:
    """The whole episodes of a run's shards (demonstrations, or the first `versions` rollout
    steps of an evaluation) as a LeRobotDataset v3.0 in `out`, one frame per env step at
    env.control_freq. Returns (episodes written, episodes left out because they had not ended)."""
    from ..envs import env_dims
    from .episodes import RecordedEpisodes

    if cfg.policy.chunk != 1:
        raise DatasetError(f"policy.chunk={cfg.policy.chunk}: the run recorded one observation per {cfg.policy.chunk} env "
                           "steps, and a LeRobotDataset frame is one env step; export a run with policy.chunk=1")
    episodes = RecordedEpisodes(run_dir, versions)
    cameras = list(cfg.env.cameras)[:env_dims(cfg).cameras]
    writer = LeRobotWriter(out, cameras, cfg.env.control_freq, robot_type=cfg.env.name)
    for ep in episodes:
        writer.add_episode(ep["images"], ep["proprio"], ep["actions"][:, 0], ep["rewards"], ep["success"], ep["task"])
    writer.close()
    return len(writer.episodes), episodes.partial


def export_lerobot(run_dir: Path, cfg, versions: int | None = None) -> str:
    """<run>/lerobot: the run's whole episodes as a LeRobotDataset; says where and how many."""
    written, partial = export_run(run_dir, run_dir / "lerobot", cfg, versions)
    return (f"LeRobotDataset v3.0: {written} episode(s) in {run_dir / 'lerobot'}"
            + (f" ({partial} unfinished when the run stopped, left out)" if partial else ""))
