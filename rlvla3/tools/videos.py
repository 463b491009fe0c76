"""Rollout videos of an evaluation run: the first episodes of each task as H.264 mp4 files
(PyAV), named by task, instruction, seed and outcome, and logged beside the run's scalars
(TensorBoard: an animated image summary; W&B: the mp4, when the run logs to W&B).

The frames are what the policy saw: the images of the run's shards, cameras side by side."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

FPS = 10   # playback rate of the videos (frames are policy steps)


def episodes_with_frames(run_dir: Path, versions: int):
    """(reset seed, success, frames [T, H, W * cameras, 3] uint8) of each episode of an
    evaluation run's first `versions` rollout steps, in shard order (frames stop where it ended)."""
    from .episodes import evaluation_segments

    for a, seeds, success in evaluation_segments(run_dir, versions):
        for e, seed in enumerate(seeds):
            images = a["images"][:int(a["valid"][:, e].sum()), e]       # [T, cams, H, W, 3]
            yield int(seed), bool(success[e]), np.concatenate(list(images.transpose(1, 0, 2, 3, 4)), axis=2)


class Mp4Writer:
    """An mp4 file written frame batch by frame batch (`add`), closed by `close` or a `with`
    block: `codec` (H.264 by default: what browsers and W&B play) in yuv420p, sides padded to
    even sizes as it needs (the padding is the edge pixels repeated)."""

    def __init__(self, path: Path, fps: int = FPS, codec: str = "libx264"):
        import av

        self.path, self.fps, self.codec = Path(path), fps, codec
        self.out = av.open(str(path), "w")
        self.stream = None
        self.frames = 0

    def add(self, frames: np.ndarray) -> None:
        """frames [T, H, W, 3] uint8 (every call the same H and W)."""
        import av

        t, h, w, _ = frames.shape
        frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        if self.stream is None:
            self.stream = self.out.add_stream(self.codec, rate=self.fps)
            self.stream.width, self.stream.height, self.stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for f in frames:
            for packet in self.stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                self.out.mux(packet)
        self.frames += t

    def close(self) -> None:
        if self.stream is not None:
            for packet in self.stream.encode():
                self.out.mux(packet)
        self.out.close()

    def __enter__(self) -> "Mp4Writer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_mp4(path: Path, frames: np.ndarray, fps: int = FPS, codec: str = "libx264") -> Path:
    """One mp4 of frames [T, H, W, 3] (Mp4Writer's codec and padding)."""
    with Mp4Writer(path, fps, codec) as w:
        w.add(frames)
    return path


def slug(text: str, limit: int = 60) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].rstrip("-") or "task"


def write_videos(run_dir: Path, versions: int, per_task: int, task_of) -> dict[Path, np.ndarray]:
    """mp4 of the first `per_task` episodes of each task into <run>/videos/, named
    `<task>-seed<seed>-<success|fail>.mp4`; `task_of(seed)` names an episode's task (its
    instruction, for a multi-task suite). Returns each file written, in order, with its frames."""
    out = run_dir / "videos"
    out.mkdir(exist_ok=True)
    written, taken = {}, defaultdict(int)
    for seed, success, frames in sorted(episodes_with_frames(run_dir, versions), key=lambda e: e[0]):
        task = task_of(seed)
        if taken[task] >= per_task or len(frames) == 0:
            continue
        taken[task] += 1
        name = f"{slug(task)}-seed{seed}-{'success' if success else 'fail'}.mp4"
        written[write_mp4(out / name, frames)] = frames
    return written


def log_videos(run_dir: Path, videos: dict[Path, np.ndarray], step: int) -> list[str]:
    """Each video into the run's TensorBoard folder (an animated GIF summary, what TensorBoard's
    image dashboard plays) and, if the run logs to W&B (<run>/wandb_id.txt), into that W&B run.
    Returns where they went."""
    went = []
    if (run_dir / "tb").is_dir():
        _tensorboard(run_dir / "tb", videos, step)
        went.append(f"TensorBoard {run_dir / 'tb'} (images tab, videos/*)")
    if (run_dir / "wandb_id.txt").exists():
        went.append(_wandb(run_dir, list(videos), step))
    return went


def read_mp4(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(presentation times [T] in seconds, frames [T, H, W, 3] uint8) of a video file."""
    import av

    with av.open(str(path)) as f:
        decoded = [(float(fr.pts * fr.time_base), fr.to_ndarray(format="rgb24")) for fr in f.decode(video=0)]
    return np.array([t for t, _ in decoded]), np.stack([x for _, x in decoded])


def _tensorboard(tb_dir: Path, videos: dict[Path, np.ndarray], step: int, prefix: str = "videos") -> None:
    import io

    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tb_dir))
    for p, frames in videos.items():
        buf = io.BytesIO()
        images = [Image.fromarray(f) for f in frames]
        images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / FPS), loop=0)
        h, w = frames.shape[1:3]
        image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=buf.getvalue())
        writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=f"{prefix}/{p.stem}", image=image)]), step)
    writer.close()


def _wandb(run_dir: Path, paths: list[Path], step: int) -> str:
    """Into the run's own W&B run (resumed by its id), after its last version's scalars."""
    import wandb

    from .. import config
    from ..engine.scalars import start_wandb

    run = start_wandb(config.load(run_dir), run_dir)
    run.log({"version": step, **{f"videos/{p.stem}": wandb.Video(str(p), fps=FPS, format="mp4") for p in paths}})
    run.finish()
    return f"W&B run {run.id}"


def episode_videos(run_dir: Path, versions: int, per_task: int, task_of, of_run: Path | None = None,
                   step: int = 0) -> list[Path]:
    """evaluate --videos: write and log the first episodes of each task, and say where they are.
    `of_run`: an evaluation for that training run (runtime.eval_every): the videos go into its
    TensorBoard at `step` (its Trainer logs them to W&B, whose run it holds)."""
    if per_task < 1:
        return []
    videos = write_videos(run_dir, versions, per_task, task_of)
    if of_run is None:
        went = log_videos(run_dir, videos, versions)
    elif (of_run / "tb").is_dir():
        _tensorboard(of_run / "tb", videos, step, "eval_videos")
        went = [f"TensorBoard {of_run / 'tb'} (images tab, eval_videos/*)"]
    else:
        went = []
    print(f"{len(videos)} video(s) in {run_dir / 'videos'}" + "".join(f"; {w}" for w in went))
    return list(videos)
