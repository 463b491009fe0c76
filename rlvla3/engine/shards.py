"""Trajectory shards (zarr 3) and the Trainer's ledger.

One shard = one segment of one env group: `steps` time steps of `n` envs, arrays time-major
[T, N, ...], one zstd chunk per array (fast, and rendered frames compress well). A shard is one
file: a zarr 3 group in a zip archive (zarr-python reads it with `zarr.storage.ZipStore`), the
entries stored uncompressed (zstd already did that). A folder of zarr 3 files per shard (what
this module wrote before, and what zarr-python writes to a LocalStore) still reads.

Atomic publish: a shard is written by exactly one Simulator into `shards/.tmp-<name>-<pid>`
and then `os.rename`d to `shards/<name>`. A reader therefore sees a complete shard or none
(writing in place while a reader polls gives torn reads: missing chunks read back as zeros).

Names sort by (rollout step, group, segment): `s000003-g00012-q000007`.

The ledger maps shard name -> first row not yet trained. It is saved inside every checkpoint,
so model, optimizer and consumed rows are committed together: after a restart from that
checkpoint every published row is trained exactly once (rows of a partially trained rollout
step are read again, because the model that trained them was never committed).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zarr

try:   # the same CRC-32 as zlib's, 25x faster (ZipWriter)
    from zlib_ng.zlib_ng import crc32
except ImportError:   # an environment without zlib-ng: the same archives, slower
    from zlib import crc32

from ..config import SHARD_CODECS
from . import faults

SCHEMA_VERSION = 2
NAME_RE = re.compile(r"^s(\d{6})-g(\d{5})-q(\d{6})$")
BAD_DIR = ".bad"

# The arrays of a shard, all time-major [T, N, ...]; one row = one policy decision (a chunk of K
# env steps when policy.chunk = K):
#   images     uint8   [T, N, cams, H, W, 3]  observation the decision was taken on
#   proprio    float32 [T, N, P]
#   tokens     int32   [T, N, L]              instruction token ids (0 = padding)
#   sample     family-specific: what the Trainer needs to recompute log pi(sample | obs)
#              - token families (tiny, openvla): int32 [T, N, K*D] action token ids (chunk-major,
#                one id per action dim; bin b of `action_bins` maps to 2b/(bins-1) - 1)
#              - pi0, pi05: float32 [T, N, S+1, K, D] the denoising chain x_0..x_S (x_0 = initial
#                noise, x_S = executed chunk before clipping); log pi = sum over the S Gaussian steps
#              - openvla_oft: float32 [T, N, K, D] the chunk in the checkpoint's normalised action
#                space (before un-normalisation); log pi = sum of K*D Gaussian terms
#   actions    float32 [T, N, K, D]           env actions of the chunk, in [-1, 1]
#   logprobs   float32 [T, N]                 log pi_behav(sample | obs) at the Generator
#   values     float32 [T, N]                 V(obs) at the Generator
#   rewards    float32 [T, N]                 reward summed over the env steps of the chunk
#   terminated, truncated, success  bool [T, N]  of the chunk's last env step
#   env_steps  int16   [T, N]                 env steps the chunk executed (policy.execute_steps of
#                                             its K, fewer where the episode ended)
#   valid      bool    [T, N]                 the env was in an episode when deciding (false only
#                                             for grpo rows after the env's episode ended)
#   versions   int32   [T, N]                 policy version that produced the row
#   bootstrap  float32 [N]                    V(obs after the last row)
# Attributes: steps, n_envs, rows, env_steps, min/max_version, episode_ends, successes, env_ids, and for
# episodic segments (grpo, evaluation) `reset_digests` (crc32 of each env's first observation:
# equal within a GRPO group, or the group's episodes did not start from one state) and
# `reset_seeds` (each env's reset seed: which initial state the segment's episode started from).
# `instructions` (per env, [row, text] wherever its instruction text changes: the text a row's
# tokens encode; absent in shards written before it was recorded).
ARRAYS = ("images", "proprio", "tokens", "sample", "actions", "logprobs", "values", "rewards",
          "terminated", "truncated", "success", "env_steps", "valid", "versions")


class ShardError(RuntimeError):
    """A shard that is missing arrays, has the wrong schema, or cannot be decoded."""


def shard_name(step: int, gid: int, seq: int) -> str:
    return f"s{step:06d}-g{gid:05d}-q{seq:06d}"


def parse_name(name: str) -> tuple[int, int, int] | None:
    """(step, gid, seq) of a published shard name, or None for anything else."""
    m = NAME_RE.match(name)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def write_shard(shards_dir: Path, name: str, arrays: dict[str, np.ndarray], bootstrap: np.ndarray,
                attrs: dict, codec: str = "zstd") -> Path:
    """Write a complete shard under a temporary name, then publish it by atomic rename; `codec`
    compresses its arrays (zstd) or not (none: runtime.shard_codec)."""
    tmp = shards_dir / f".tmp-{name}-{os.getpid()}"
    remove(tmp)
    T, N = arrays["rewards"].shape
    versions = arrays["versions"]
    group = {"attributes": {
        "schema_version": SCHEMA_VERSION,
        "steps": int(T),
        "n_envs": int(N),
        "rows": int(T * N),
        "env_steps": int(arrays["env_steps"].sum()),
        "min_version": int(versions.min()),
        "max_version": int(versions.max()),
        "episode_ends": int((arrays["terminated"] | arrays["truncated"]).sum()),
        "successes": int(arrays["success"].sum()),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "written_at": time.time(),
        **attrs,
    }, "zarr_format": 3, "node_type": "group"}
    raw = sum(a.nbytes for a in arrays.values()) + (1 << 20)   # compression only shrinks; 1 MiB for the metadata
    writer = ZipWriter(tmp, large=raw >= ZipWriter.LIMIT)
    try:
        writer.add(GROUP_META, json.dumps(group).encode())
        for key in ARRAYS:
            write_array(writer, key, arrays[key], codec)
        write_array(writer, "bootstrap", np.asarray(bootstrap, np.float32), codec)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    faults.reach("shard_write")
    final = shards_dir / name
    os.rename(tmp, final)  # atomic within one filesystem; readers see all or nothing
    return final


# ---------------------------------------------------------------- zarr 3, written and read directly
# A shard's arrays are zarr 3 arrays of one chunk each: `bytes` (little-endian), then `zstd`
# (level 1) unless runtime.shard_codec=none. zarr-python's own write path cost ~10x np.save of the
# same arrays (117-127 vs 7-9 ms for a 12.6 MB segment; per-array overhead, not compression), so
# the entries are written and read here as plain zarr 3 that zarr-python reads and writes too
# (tests/engine/test_shards.py checks both ways). One file, not a folder: a folder of zarr 3 files costs
# a mkdir, a zarr.json and a chunk file per array (~46 file operations a shard against np.save's
# 16, 10-25 ms on an overlay filesystem whatever the bytes); the zip is one create and one
# rename. The chunk key separator is "." (`c.0.0`, zarr-python's default is nested `c/0/0`).
# Metadata this writer would not write is read through zarr-python.
ZSTD_LEVEL = 1
GROUP_META = "zarr.json"
LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")   # a zip entry's local header (30 bytes): its name, extra field, then its bytes
LOCAL_MAGIC = 0x04034B50


def zstd_codec():
    from numcodecs import Zstd  # zarr's own zstd (numcodecs), so the frames are the ones zarr writes

    return Zstd(level=ZSTD_LEVEL)


def array_meta(a: np.ndarray, codec: str = "zstd") -> dict:
    """The zarr.json of `a` as one chunk, compressed by `codec` (zstd or none)."""
    kind = a.dtype.kind
    fill = False if kind == "b" else 0.0 if kind == "f" else 0
    codecs = [{"name": "bytes"} if a.dtype.itemsize == 1 else {"name": "bytes", "configuration": {"endian": "little"}}]
    if codec == "zstd":
        codecs.append({"name": "zstd", "configuration": {"level": ZSTD_LEVEL, "checksum": False}})
    return {"shape": list(a.shape), "data_type": a.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(a.shape)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
            "fill_value": fill, "codecs": codecs,
            "attributes": {}, "zarr_format": 3, "node_type": "array", "storage_transformers": []}


def chunk_key(ndim: int) -> str:
    return ".".join(["c", *["0"] * ndim])


PROBE_BYTES = 1 << 18   # a large array is compressed only if this much of its middle shrinks
PROBE_MIN_SAVING = 0.1
FILL_CHECK_BYTES = 1 << 18   # arrays up to this size are looked at for all-fill (frames never are)


def pays_to_compress(a: np.ndarray) -> bool:
    """Whether zstd shrinks `a` by at least PROBE_MIN_SAVING, judged on a slice of its middle for a
    large array: frames that are noise to zstd (textured scenes, camera noise) cost the full
    compression for nothing, and the output buffer's page faults on top (`bench shards`, noise rows)."""
    raw = memoryview(a).cast("B")
    if raw.nbytes <= 2 * PROBE_BYTES:
        return True
    mid = raw.nbytes // 2
    probe = raw[mid - PROBE_BYTES // 2: mid + PROBE_BYTES // 2]
    return len(zstd_codec().encode(probe)) <= (1 - PROBE_MIN_SAVING) * probe.nbytes


class ZipWriter:
    """A zip archive of stored entries, written front to back (PKWARE APPNOTE 4.3: a local header
    and the bytes of each entry, then the central directory). zipfile's writer checksums with
    zlib's CRC-32, ~5.9 ms for a 12.6 MB segment on this CPU, as long as np.save's whole write;
    zlib-ng's computes the same CRC in 0.24 ms. A `large` archive (4 GiB or more: zip64) is
    written by zipfile instead: the same entries, the same readers."""

    CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")    # central directory header, to the local header's offset (46 bytes)
    END = struct.Struct("<IHHHHIIH")                 # end of central directory (22 bytes)
    EPOCH = (1980, 1, 1, 0, 0, 0)                    # every entry's timestamp: a shard's bytes depend on its contents only
    DOS_TIME = (0, 33)                               # EPOCH as the headers' DOS time and date fields
    LIMIT = 0xFFFFFFFF                               # sizes and offsets above this need zip64

    def __init__(self, path: Path, large: bool = False):
        self.f = open(path, "wb")
        self.zf = zipfile.ZipFile(self.f, "w", zipfile.ZIP_STORED) if large else None
        self.central: list[bytes] = []
        self.offset = 0

    def add(self, name: str, data) -> None:
        data = memoryview(data).cast("B")
        if self.zf is not None:
            self.zf.writestr(zipfile.ZipInfo(name, date_time=self.EPOCH), data)
            return
        fname, crc, n = name.encode(), crc32(data), data.nbytes
        head = LOCAL_HEADER.pack(LOCAL_MAGIC, 20, 0, 0, *self.DOS_TIME, crc, n, n, len(fname), 0)
        self.central.append(self.CENTRAL.pack(0x02014B50, 20, 20, 0, 0, *self.DOS_TIME, crc, n, n, len(fname),
                                              0, 0, 0, 0, 0, self.offset) + fname)
        self.f.write(head + fname)
        self.f.write(data)
        self.offset += len(head) + len(fname) + n

    def close(self) -> None:
        if self.zf is not None:
            self.zf.close()
        else:
            directory = b"".join(self.central)
            n = len(self.central)
            self.f.write(directory + self.END.pack(0x06054B50, 0, 0, n, n, len(directory), self.offset, 0))
        self.f.close()

    def abort(self) -> None:
        self.f.close()


def write_array(zf: ZipWriter, key: str, a: np.ndarray, codec: str = "zstd") -> None:
    """One array as a zarr 3 array of one chunk. With codec zstd, an array that zstd would not
    shrink is written raw (its own zarr.json says so; readers follow each array's metadata); a
    chunk holding only the fill value is not written at all, as zarr-python does by default."""
    a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if codec == "zstd" and not pays_to_compress(a):
        codec = "none"
    zf.add(f"{key}/zarr.json", json.dumps(array_meta(a, codec)).encode())
    if a.nbytes <= FILL_CHECK_BYTES and not a.view(np.uint8).any():   # every fill value is zero bytes (array_meta)
        return
    zf.add(f"{key}/{chunk_key(a.ndim)}", zstd_codec().encode(a) if codec == "zstd" else a)


class ZipEntries:
    """A shard file's entries, read straight into their destination: the central directory is
    parsed once (zipfile), each entry's bytes then read at its offset with no CRC pass (a
    published shard is never written again: the rename publishes it whole; zstd frames carry
    their own sizes) and no intermediate copy."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.f = open(self.path, "rb")
        try:
            self.infos = {i.filename: i for i in zipfile.ZipFile(self.f).infolist()}
        except zipfile.BadZipFile as e:
            self.f.close()
            raise ShardError(f"{self.path.name}: not a zip archive ({e})") from e

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def has(self, name: str) -> bool:
        return name in self.infos

    def _data(self, name: str) -> tuple[int, int]:
        """(offset, size) of an entry's stored bytes."""
        info = self.infos[name]
        if info.compress_type != zipfile.ZIP_STORED:
            raise ShardError(f"{self.path.name}: entry {name} is zip-compressed (shards store entries as they are)")
        self.f.seek(info.header_offset)
        head = LOCAL_HEADER.unpack(self.f.read(LOCAL_HEADER.size))
        if head[0] != LOCAL_MAGIC:
            raise ShardError(f"{self.path.name}: entry {name} has no local header at offset {info.header_offset}")
        return info.header_offset + LOCAL_HEADER.size + head[9] + head[10], info.compress_size

    def read(self, name: str) -> bytes:
        offset, size = self._data(name)
        self.f.seek(offset)
        return self.f.read(size)

    def read_into(self, name: str, out: memoryview) -> None:
        offset, size = self._data(name)
        if size != out.nbytes:
            raise ShardError(f"{self.path.name}: entry {name} holds {size} bytes, its array {out.nbytes}")
        self.f.seek(offset)
        if self.f.readinto(out) != size:
            raise ShardError(f"{self.path.name}: entry {name} ends before its {size} bytes")

    def zarr_array(self, key: str) -> np.ndarray:
        from zarr.storage import ZipStore

        return zarr.open_array(store=ZipStore(self.path, mode="r"), path=key, mode="r")[...]


class FolderEntries:
    """A shard folder's files under the same names (shards written before shards were one file,
    or by zarr-python to a LocalStore)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    def read(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def read_into(self, name: str, out: memoryview) -> None:
        with open(self.path / name, "rb") as f:
            f.readinto(out)

    def zarr_array(self, key: str) -> np.ndarray:
        return zarr.open_array(str(self.path / key), mode="r")[...]


def entries(path: Path) -> ZipEntries | FolderEntries:
    return FolderEntries(path) if Path(path).is_dir() else ZipEntries(path)


def read_array(src: ZipEntries | FolderEntries, key: str) -> np.ndarray:
    """One array of a shard: directly when its metadata is what write_array writes, otherwise
    (a shard written by zarr-python, say) through zarr-python."""
    meta = json.loads(src.read(f"{key}/zarr.json"))
    a = np.empty(meta["shape"], np.dtype(meta["data_type"]))
    codec = next((c for c in SHARD_CODECS if meta == array_meta(a, c)), None)
    if codec is None:
        return src.zarr_array(key)
    chunk = f"{key}/{chunk_key(a.ndim)}"
    if not src.has(chunk):   # a writer that skips chunks holding only the fill value (zarr-python's default)
        a[...] = meta["fill_value"]
    elif codec == "zstd":
        zstd_codec().decode(src.read(chunk), out=a)
    else:
        src.read_into(chunk, memoryview(a).cast("B"))
    return a


def read_attrs(path: Path) -> dict:
    """A published shard's attributes (rows, versions, ...) without reading its arrays. Raises
    ShardError for a torn or foreign file or folder (no or broken zarr.json, missing attributes)."""
    try:
        with entries(path) as src:
            attrs = json.loads(src.read(GROUP_META))["attributes"]
        for key in ("rows", "min_version", "max_version", "env_steps"):
            int(attrs[key])
        return attrs
    except ShardError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ShardError(f"{Path(path).name}: unreadable attributes ({type(e).__name__}: {e})") from e


def read_shard(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    """All arrays of a published shard (time-major), and its attributes. Raises ShardError."""
    path = Path(path)
    try:
        with entries(path) as src:
            attrs = json.loads(src.read(GROUP_META))["attributes"]
            if attrs.get("schema_version") != SCHEMA_VERSION:
                raise ShardError(f"{path.name}: schema_version={attrs.get('schema_version')!r}, expected {SCHEMA_VERSION}")
            out = {k: read_array(src, k) for k in (*ARRAYS, "bootstrap")}
    except ShardError:
        raise
    except Exception as e:  # zarr raises many types for truncated/corrupt data
        raise ShardError(f"{path.name}: unreadable ({type(e).__name__}: {e})") from e
    T, N = attrs["steps"], attrs["n_envs"]
    for k in ARRAYS:
        if out[k].shape[:2] != (T, N):
            raise ShardError(f"{path.name}: array {k} has shape {out[k].shape}, expected [{T}, {N}, ...]")
    if out["bootstrap"].shape != (N,):
        raise ShardError(f"{path.name}: bootstrap has shape {out['bootstrap'].shape}, expected [{N}]")
    return out, attrs


def remove(path: Path) -> None:
    """Delete a shard (a file, or a folder of the older layout); nothing if it is not there."""
    if Path(path).is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def quarantine(path: Path, reason: str) -> None:
    """Move a bad shard aside (never delete data) and warn."""
    bad = path.parent / BAD_DIR
    bad.mkdir(exist_ok=True)
    target = bad / f"{path.name}-{int(time.time() * 1000)}"
    warnings.warn(f"skipping shard {path.name}: {reason}; moved to {BAD_DIR}/", stacklevel=2)
    try:
        os.rename(path, target)
    except OSError as e:
        warnings.warn(f"could not move {path.name} aside: {e}", stacklevel=2)


def next_seq(shards_dir: Path, gid: int) -> int:
    """The segment index group `gid` continues at after a restart: one past the highest it ever
    published, quarantined shards (.bad/<name>-<ms>) and deleted ones' successors included, so a
    new shard never lands on an existing name."""
    seqs = [p[2] for n in scan(shards_dir) if (p := parse_name(n)) and p[1] == gid]
    bad = shards_dir / BAD_DIR
    if bad.is_dir():
        seqs += [p[2] for e in os.scandir(bad) if (p := parse_name(e.name.rsplit("-", 1)[0])) and p[1] == gid]
    return max(seqs, default=-1) + 1


def scan(shards_dir: Path) -> list[str]:
    """Published shard names, sorted (no zarr listing: os.scandir is ~100x cheaper per shard)."""
    if not shards_dir.exists():
        return []
    return sorted(e.name for e in os.scandir(shards_dir) if parse_name(e.name))


def clean_partial(shards_dir: Path) -> int:
    """Remove unpublished temporaries left by a crashed writer. Returns how many."""
    n = 0
    if shards_dir.exists():
        for e in os.scandir(shards_dir):
            if e.name.startswith(".tmp-"):
                remove(Path(e.path))
                n += 1
    return n


@dataclass
class Ledger:
    """shard name -> first row not yet trained; a shard absent from `rows` is untouched."""

    rows: dict[str, int]

    @classmethod
    def empty(cls) -> "Ledger":
        return cls({})

    def consumed(self, name: str) -> int:
        return self.rows.get(name, 0)

    def advance(self, name: str, stop: int) -> None:
        if stop < self.consumed(name):
            raise ValueError(f"ledger: {name} would move back from row {self.consumed(name)} to {stop}")
        self.rows[name] = stop

    def total(self) -> int:
        return sum(self.rows.values())

    def to_state(self) -> dict:
        return {"rows": dict(self.rows)}

    @classmethod
    def from_state(cls, state: dict) -> "Ledger":
        return cls({str(k): int(v) for k, v in state["rows"].items()})
