"""LeRobotDataset in: a dataset written here to the published v3.0 layout (and v2.1's),
by this test's own layout writer on pyarrow (mp4 through the project's PyAV encoder), not by
anything of the reader's, is read onto the toy env's spec and trained from with
`python -m rlvla3.sft`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlvla3.cluster.compose import compose
from rlvla3.envs.toy import ToyEnv
from rlvla3.tools.lerobot_dataset import DatasetError, load_lerobot
from rlvla3.tools.videos import write_mp4

FPS = 10
CAM = "observation.images.agentview"
SIDE = 84   # the toy's 21 px, 4x: the reader resizes to env.image_size


def expert_episodes(n: int) -> list[dict]:
    """n toy episodes of the scripted expert: frames [T, 21, 21, 3], state, action, task."""
    env, out = ToyEnv(compose(["+experiment=toy"]).env), []
    for seed in range(n):
        obs, frames, state, action = env.reset(seed), [], [], []
        for _ in range(6):
            a = env.expert_action()
            frames.append(obs.images[0])
            state.append(obs.proprio)
            action.append(a)
            obs, _, done, _, _ = env.step(a)
            if done:
                break
        out.append({"frames": np.stack(frames), "state": np.stack(state), "action": np.stack(action),
                    "task": obs.instruction})
    return out


def features(codec: str, state_dim: int = 2) -> dict:
    scalar = {"shape": [1], "names": None}
    return {CAM: {"dtype": "video", "shape": [SIDE, SIDE, 3], "names": ["height", "width", "channels"],
                  "info": {"video.fps": FPS, "video.codec": codec, "video.pix_fmt": "yuv420p", "video.height": SIDE,
                           "video.width": SIDE, "video.channels": 3, "has_audio": False}},
            "observation.state": {"dtype": "float32", "shape": [state_dim], "names": ["x", "y"][:state_dim]},
            "action": {"dtype": "float32", "shape": [2], "names": ["dx", "dy"]},
            "timestamp": {"dtype": "float32", **scalar}, "frame_index": {"dtype": "int64", **scalar},
            "episode_index": {"dtype": "int64", **scalar}, "index": {"dtype": "int64", **scalar},
            "task_index": {"dtype": "int64", **scalar}}


def frame_table(episodes: list[dict], tasks: dict[str, int], first_index: int = 0):
    import pyarrow as pa

    cols = {k: [] for k in ("observation.state", "action", "timestamp", "frame_index", "episode_index", "index",
                            "task_index")}
    i = first_index
    for e, ep in episodes:
        for t in range(len(ep["frames"])):
            cols["observation.state"].append(ep["state"][t].tolist())
            cols["action"].append(ep["action"][t].tolist())
            cols["timestamp"].append(t / FPS)
            cols["frame_index"].append(t)
            cols["episode_index"].append(e)
            cols["index"].append(i)
            cols["task_index"].append(tasks[ep["task"]])
            i += 1
    return pa.table({"observation.state": pa.array(cols["observation.state"], pa.list_(pa.float32(), 2)),
                     "action": pa.array(cols["action"], pa.list_(pa.float32(), 2)),
                     "timestamp": pa.array(cols["timestamp"], pa.float32()),
                     **{k: pa.array(cols[k], pa.int64()) for k in ("frame_index", "episode_index", "index", "task_index")}})


# The columns of a v3.0 meta/episodes parquet that readers locate an episode by (write_v30 below).
FIXTURE_EPISODE_COLUMNS = {"episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                           "dataset_from_index", "dataset_to_index", f"videos/{CAM}/chunk_index",
                           f"videos/{CAM}/file_index", f"videos/{CAM}/from_timestamp", f"videos/{CAM}/to_timestamp",
                           "meta/episodes/chunk_index", "meta/episodes/file_index"}


def big(frames: np.ndarray) -> np.ndarray:
    return frames.repeat(SIDE // frames.shape[1], 1).repeat(SIDE // frames.shape[2], 2)


def write_v30(folder: Path, episodes: list[dict], state_dim: int = 2) -> Path:
    """The v3.0 layout: every episode in one data parquet and one mp4 per camera (chunk 0, file 0),
    episodes located by meta/episodes/chunk-000/file-000.parquet, tasks in meta/tasks.parquet;
    AV1 video (libsvtav1, LeRobot's default encoder)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tasks = {t: i for i, t in enumerate(dict.fromkeys(ep["task"] for ep in episodes))}
    (folder / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    (folder / "data" / "chunk-000").mkdir(parents=True)
    pq.write_table(frame_table(list(enumerate(episodes)), tasks), folder / "data" / "chunk-000" / "file-000.parquet")
    video = folder / "videos" / CAM / "chunk-000" / "file-000.mp4"
    video.parent.mkdir(parents=True)
    write_mp4(video, big(np.concatenate([ep["frames"] for ep in episodes])), FPS, "libsvtav1")
    rows, start = [], 0
    for e, ep in enumerate(episodes):
        n = len(ep["frames"])
        rows.append({"episode_index": e, "tasks": [ep["task"]], "length": n, "data/chunk_index": 0, "data/file_index": 0,
                     "dataset_from_index": start, "dataset_to_index": start + n,
                     f"videos/{CAM}/chunk_index": 0, f"videos/{CAM}/file_index": 0,
                     f"videos/{CAM}/from_timestamp": start / FPS, f"videos/{CAM}/to_timestamp": (start + n) / FPS,
                     "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
        start += n
    pq.write_table(pa.Table.from_pylist(rows), folder / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    # pandas' to_parquet of {task_index} indexed by the task string "task": two columns on disk
    pq.write_table(pa.table({"task_index": pa.array(list(tasks.values()), pa.int64()), "task": list(tasks)}),
                   folder / "meta" / "tasks.parquet")
    info = {"codebase_version": "v3.0", "robot_type": "toy", "total_episodes": len(episodes), "total_frames": start,
            "total_tasks": len(tasks), "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
            "fps": FPS, "splits": {"train": f"0:{len(episodes)}"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": features("av1", state_dim)}
    (folder / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    return folder


def write_v21(folder: Path, episodes: list[dict]) -> Path:
    """The v2.1 layout: one parquet and one mp4 per episode, meta/episodes.jsonl and tasks.jsonl;
    H.264 video."""
    import pyarrow.parquet as pq

    tasks = {t: i for i, t in enumerate(dict.fromkeys(ep["task"] for ep in episodes))}
    (folder / "meta").mkdir(parents=True)
    (folder / "data" / "chunk-000").mkdir(parents=True)
    start = 0
    for e, ep in enumerate(episodes):
        pq.write_table(frame_table([(e, ep)], tasks, start), folder / "data" / "chunk-000" / f"episode_{e:06d}.parquet")
        video = folder / "videos" / "chunk-000" / CAM / f"episode_{e:06d}.mp4"
        video.parent.mkdir(parents=True, exist_ok=True)
        write_mp4(video, big(ep["frames"]), FPS, "libx264")
        start += len(ep["frames"])
    (folder / "meta" / "episodes.jsonl").write_text("".join(
        json.dumps({"episode_index": e, "tasks": [ep["task"]], "length": len(ep["frames"])}) + "\n"
        for e, ep in enumerate(episodes)))
    (folder / "meta" / "tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                         for t, i in tasks.items()))
    info = {"codebase_version": "v2.1", "robot_type": "toy", "total_episodes": len(episodes), "total_frames": start,
            "total_tasks": len(tasks), "total_videos": len(episodes), "total_chunks": 1, "chunks_size": 1000, "fps": FPS,
            "splits": {"train": f"0:{len(episodes)}"},
            "data_path": "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
            "video_path": "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
            "features": features("h264")}
    (folder / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    return folder


@pytest.mark.parametrize("writer", [write_v30, write_v21], ids=["v3.0", "v2.1"])
def test_a_lerobot_dataset_reads_onto_the_envs_spec(tmp_path, writer):
    from rlvla3.policies.prompts import instruction_encoder

    episodes = expert_episodes(6)
    cfg = compose(["+experiment=toy"])
    rows = load_lerobot(writer(tmp_path / "ds", episodes), cfg)
    if writer is write_v30:
        import pyarrow.parquet as pq

        meta = tmp_path / "ds" / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        assert set(pq.read_schema(meta).names) == FIXTURE_EPISODE_COLUMNS
    n = sum(len(ep["frames"]) for ep in episodes)
    assert rows["images"].shape == (n, 1, 21, 21, 3) and rows["actions"].shape == (n, 2)
    assert np.array_equal(rows["proprio"], np.concatenate([ep["state"] for ep in episodes]))
    assert np.array_equal(rows["actions"], np.concatenate([ep["action"] for ep in episodes]))
    assert np.flatnonzero(rows["ended"]).tolist() == list(np.cumsum([len(ep["frames"]) for ep in episodes]) - 1)
    encode = instruction_encoder(cfg.policy)
    assert np.array_equal(rows["tokens"], np.stack([encode(ep["task"]) for ep in episodes for _ in ep["frames"]]))
    # H.264 is lossy; each frame must still be its own picture (not its neighbour's), every frame
    source = np.concatenate([ep["frames"] for ep in episodes]).astype(int)
    err = np.abs(rows["images"][:, 0].astype(int) - source).mean((1, 2, 3))
    shifted = np.abs(rows["images"][1:, 0].astype(int) - source[:-1]).mean((1, 2, 3))
    assert err.max() < 6 and (err[1:] < shifted).mean() > 0.9, (err.max(), (err[1:] < shifted).mean())


def test_a_feature_that_does_not_fit_the_env_is_named(tmp_path):
    episodes = expert_episodes(2)
    cfg = compose(["+experiment=toy"])
    bad = write_v30(tmp_path / "ds", episodes, state_dim=1)
    with pytest.raises(DatasetError, match=r"'observation.state' has shape \[1\]; the env's proprio has 2"):
        load_lerobot(bad, cfg)
    good = write_v30(tmp_path / "ds2", episodes)
    with pytest.raises(DatasetError, match=r"env camera 'agentview' reads feature 'observation.images.wrist'.*"
                                           r"--cameras agentview=<feature>"):
        load_lerobot(good, cfg, {"agentview": "observation.images.wrist"})


def test_sft_trains_from_a_lerobot_v30_dataset(tmp_path):
    ds = write_v30(tmp_path / "ds", expert_episodes(24))
    out = subprocess.run([sys.executable, "-m", "rlvla3.sft", "--demos", str(ds), "--steps", "40", "--out",
                          str(tmp_path / "sft.pt"), "+experiment=toy"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "demonstration rows" in out.stdout and (tmp_path / "sft.pt").stat().st_size > 0
    summary = next(line for line in out.stdout.splitlines() if "demonstration rows" in line)   # after the progress lines
    first, last = (float(x) for x in summary.split("loss ")[1].split(";")[0].split(" -> "))
    assert last < first, out.stdout   # the cloning loss falls on these demonstrations
