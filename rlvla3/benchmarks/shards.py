"""`python -m rlvla3.bench shards`: writing and reading one segment's shard against `np.save` /
`np.load` of the same arrays in the same folder, side by side in one run, and against
zarr-python's own path (what rlvla3 used before it wrote the zarr 3 files itself); shards with
zstd (the default) and without compression (runtime.shard_codec=none).

The segment is the engine's: T = algo.segment_steps rows of env.num_envs envs, every array of
the shard schema; images either rendered by robosuite Lift (what a Simulator writes; rendered
frames compress well) or uniform noise (the worst case: zstd cannot shrink it). Each operation
is repeated (`--repeats`, the operations taking turns, each after an `os.sync()`), the median of CPU time (the process's,
zarr-python works on a thread of its own) and wall time reported; MB/s
counts the arrays' raw bytes, "x" is np.save's (np.load's) time over this one's.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .common import save_rows


def rendered_images(cfg, T: int, n: int) -> np.ndarray:
    """[T, n, cams, S, S, 3] frames of robosuite Lift under random actions, env i from seed i."""
    from ..envs import env_dims, make_env

    env, action_dim = make_env(cfg, 0), env_dims(cfg).action_dim
    out = np.empty((T, n, len(cfg.env.cameras), cfg.env.image_size, cfg.env.image_size, 3), np.uint8)
    rng = np.random.default_rng(0)
    for i in range(n):
        obs = env.reset(i)
        for t in range(T):
            out[t, i] = obs.images
            obs = env.step(rng.uniform(-1, 1, action_dim).astype(np.float32))[0]
    return out


def segment(images: np.ndarray) -> dict[str, np.ndarray]:
    T, n = images.shape[:2]
    rng = np.random.default_rng(1)
    f32 = lambda *shape: rng.normal(size=(T, n, *shape)).astype(np.float32)   # noqa: E731
    return {"images": images, "proprio": f32(9), "tokens": rng.integers(0, 500, (T, n, 16)).astype(np.int32),
            "sample": rng.integers(0, 256, (T, n, 7)).astype(np.int32), "actions": f32(1, 7), "logprobs": f32(),
            "values": f32(), "rewards": f32(), "terminated": np.zeros((T, n), bool), "truncated": np.zeros((T, n), bool),
            "success": np.zeros((T, n), bool), "env_steps": np.ones((T, n), np.int16), "valid": np.ones((T, n), bool),
            "versions": np.zeros((T, n), np.int32)}


def zarr_python_write(folder: Path, arrays: dict, bootstrap: np.ndarray) -> None:
    """The same arrays through zarr-python (one zstd-1 chunk each), as rlvla3 wrote shards before."""
    import zarr
    from zarr.codecs import ZstdCodec

    root = zarr.open_group(str(folder), mode="w")
    for key, a in {**arrays, "bootstrap": bootstrap}.items():
        root.create_array(key, data=a, chunks=a.shape, compressors=ZstdCodec(level=1))


def timed(ops: list[tuple[str, object]], repeats: int) -> dict[str, tuple[float, float]]:
    """op -> median (CPU s of the whole process, wall s) of `repeats` calls fn(i), the ops taking
    turns within each repeat, in a rotating order, so that the machine's noise falls on all of them alike."""
    got = {op: ([], []) for op, _ in ops}
    for i in range(repeats):
        for op, fn in ops[i % len(ops):] + ops[:i % len(ops)]:   # each op first as often
            # Every op starts with no dirty pages: a write that came after others' was throttled by
            # their writeback (np.save measured 4.5 ms first, 35 ms after a few other writes).
            os.sync()
            c0, w0 = time.process_time(), time.perf_counter()
            fn(i)
            got[op][0].append(time.process_time() - c0)
            got[op][1].append(time.perf_counter() - w0)
    return {op: (float(np.median(c)), float(np.median(w))) for op, (c, w) in got.items()}


def disk_mb(path: Path) -> float:
    """Bytes on disk of a shard (one file) or of a folder of files."""
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def one_kind(label: str, arrays: dict, repeats: int, root: Path) -> list[dict]:
    from ..engine import shards

    mb = sum(a.nbytes for a in arrays.values()) / 1e6
    boot = np.zeros(arrays["rewards"].shape[1], np.float32)
    d = Path(tempfile.mkdtemp(dir=root))
    name = lambda i: shards.shard_name(0, 0, i)   # noqa: E731

    def np_save(i):
        (d / f"np{i}").mkdir()
        for k, a in arrays.items():
            np.save(d / f"np{i}" / f"{k}.npy", a)

    def np_load(i):
        return {k: np.load(d / f"np{i}" / f"{k}.npy") for k in arrays}

    def zarr_python_read(i):
        import zarr

        root_ = zarr.open_group(str(d / f"zp{i}"), mode="r")
        return {k: root_[k][...] for k in arrays}

    def zstd_alone(i):
        # what the default codec's compression costs with no file at all: the floor of "shard write"
        return [shards.zstd_codec().encode(a) for a in arrays.values() if shards.pays_to_compress(a)]

    raw = lambda i: shards.shard_name(1, 0, i)   # noqa: E731
    writes = [("np.save", np_save), ("shard write", lambda i: shards.write_shard(d, name(i), arrays, boot, {})),
              ("shard write, none", lambda i: shards.write_shard(d, raw(i), arrays, boot, {}, "none")),
              ("zstd alone, no I/O", zstd_alone),
              ("zarr-python write", lambda i: zarr_python_write(d / f"zp{i}", arrays, boot))]
    reads = [("np.load", np_load), ("shard read", lambda i: shards.read_shard(d / name(i))),
             ("shard read, none", lambda i: shards.read_shard(d / raw(i))), ("zarr-python read", zarr_python_read)]
    times = {**timed(writes, repeats), **timed(reads, repeats)}
    write_ops = {op for op, _ in writes}
    rows = []
    for op, (cpu, wall) in times.items():
        rows.append({"images": label, "op": op, "cpu_ms": cpu * 1e3, "wall_ms": wall * 1e3, "mb_per_s": mb / wall, "raw_mb": mb})
    for r in rows:
        ref = next(x for x in rows if x["op"] == ("np.save" if r["op"] in write_ops else "np.load"))
        r["x_numpy"] = ref["wall_ms"] / r["wall_ms"]
        r["x_numpy_cpu"] = ref["cpu_ms"] / r["cpu_ms"]
    rows[0]["disk_mb"], rows[1]["disk_mb"], rows[2]["disk_mb"] = (disk_mb(d / f) for f in ("np0", name(0), raw(0)))
    shutil.rmtree(d)
    return rows


def run(a) -> int:
    from ..cluster.compose import compose

    cfg = compose(["env.image_size=128", "env.cameras=[agentview,robot0_eye_in_hand]", "env.num_envs=4", *a.overrides])
    T, n = cfg.algo.segment_steps, cfg.env.num_envs
    root = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-bench-shards-"))
    root.mkdir(parents=True, exist_ok=True)
    kinds = {"rendered": rendered_images(cfg, T, n)}
    kinds["noise"] = np.random.default_rng(2).integers(0, 256, kinds["rendered"].shape, dtype=np.uint8)
    rows = []
    print(f"segment: T={T} x {n} envs, {len(cfg.env.cameras)} cameras at {cfg.env.image_size}^2; "
          f"{a.repeats} repeats, medians; folder {root}")
    print(f"{'images':9s} {'operation':18s} {'cpu ms':>8s} {'wall ms':>8s} {'MB/s':>8s} {'x numpy':>8s} {'x cpu':>6s} {'on disk MB':>10s}")
    for label, images in kinds.items():
        for r in one_kind(label, segment(images), a.repeats, root):
            rows.append(r)
            disk = f"{r['disk_mb']:10.2f}" if "disk_mb" in r else ""
            print(f"{label:9s} {r['op']:18s} {r['cpu_ms']:8.1f} {r['wall_ms']:8.1f} {r['mb_per_s']:8.0f} "
                  f"{r['x_numpy']:8.2f} {r['x_numpy_cpu']:6.2f} {disk}")
    print(f"raw MB per segment: {rows[0]['raw_mb']:.1f}; x numpy = np.save's (np.load's) wall time / this one's (>= 0.8 is the target)")
    save_rows(a.out, "shards.json", rows)
    return 0
