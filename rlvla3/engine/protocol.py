"""Every message rlvla3 ranks exchange, and its MPI tag (who sends which to whom: wiring.py).

Control messages are small frozen dataclasses sent pickled (lowercase mpi4py, ~10 µs).
Bulk data never rides in them: observations and actions travel as packed numpy byte buffers
(uppercase mpi4py, preallocated, one per env group), weights as one flat float32 buffer, and
trajectories as shard paths ("send a pointer, not the payload").

Every sample carries the policy version that produced it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np


class Tag(IntEnum):
    """MPI tags; who sends each to whom, with which message, is the edge list (wiring.py)."""

    HEARTBEAT = 1
    SHARD_READY = 2
    WEIGHTS = 3
    WEIGHTS_BUF = 4
    STOP = 5
    DONE = 6
    TRAIN_ORDER = 7
    CLOCK = 8
    CKPT_ACK = 9
    GROUP_ADDRESS = 10
    OBS = 1000           # OBS + gid: one tag per env group
    ACTION = 40000       # ACTION + gid


MAX_GROUPS = Tag.ACTION - Tag.OBS


def tag_family(tag: int) -> int:
    """The tag a raw MPI tag belongs to (OBS + gid -> OBS, ACTION + gid -> ACTION)."""
    if tag >= Tag.ACTION:
        return Tag.ACTION
    if tag >= Tag.OBS:
        return Tag.OBS
    return tag


class Kind(IntEnum):
    """What an OBS request asks for (its header's kind)."""

    ACT = 0        # an action for this obs (a training sample; needs a credit)
    BOOTSTRAP = 1  # only V(obs) to close a segment; served without credits


@dataclass(frozen=True)
class Heartbeat:
    t: float
    started: bool = False   # the sender's start-up is over: hold it to the liveness timeout from now on


@dataclass(frozen=True)
class ClockSync:
    """A wall-clock reading for the clock-offset ping-pong with rank 0."""

    t: float


@dataclass(frozen=True)
class ShardReady:
    """A segment was published as a shard. Sent by its Simulator to every Trainer."""

    name: str            # directory name under <run>/shards/
    gid: int
    seq: int             # segment index within the group
    rollout_step: int    # the rollout step this segment belongs to (its credit step)
    rows: int            # steps * n_envs
    min_version: int
    max_version: int
    env_steps: int       # env steps the segment executed (rows x executed steps a chunk at most)
    # rollout statistics for the segment (for progress and metrics)
    episodes: int = 0
    successes: int = 0
    return_sum: float = 0.0
    env_errors: int = 0
    sim_rank: int = -1
    task_stats: dict = field(default_factory=dict)   # a multi-task run: task -> [episodes, successes]


@dataclass(frozen=True)
class WeightsHeader:
    version: int
    granted_until: int   # generators may serve requests for rollout steps <= this
    n_params: int
    dtype: str = "float32"      # wire format (weights.py): float32 | bfloat16
    bucket_mb: float = 64.0     # the buffer follows in buckets of at most this many MiB


@dataclass(frozen=True)
class Stop:
    reason: str


@dataclass(frozen=True)
class Done:
    rank: int
    role: str


@dataclass(frozen=True)
class Slice:
    """Rows [start, stop) of a shard, trained by Trainer `owner` (index among Trainers)."""

    name: str
    start: int
    stop: int
    owner: int


@dataclass(frozen=True)
class TrainOrder:
    """Trainer 0 tells every Trainer what the next optimizer step trains (or to stop)."""

    version: int                   # the version being trained (== its rollout step)
    opt_step: int                  # global optimizer step counter (after this one)
    slices: tuple[Slice, ...] = ()
    end_of_version: bool = False   # after this optimizer step, publish version + 1
    first_epoch: bool = False      # its rows are trained for the first time (they count as consumed)
    stop: bool = False
    checkpoint: str = ""           # no step: write this rank's shards of this checkpoint (a preemption's)


@dataclass(frozen=True)
class GroupAddress:
    """Trainer 0's address for the Trainers' torch.distributed process group."""

    host: str
    port: int


@dataclass(frozen=True)
class CheckpointAck:
    """Trainer 0 wrote checkpoint `name` after a preemption signal: rank 0 may requeue."""

    name: str


# ---------------------------------------------------------------- packed buffers

HEADER = 4  # int64 words: gid, request id, rollout step (requests) or version (replies), kind


@dataclass(frozen=True)
class Codec:
    """Packs named per-sample arrays for n samples into one byte buffer after an int64 header.

    `fields` maps name -> (per-sample shape, dtype). Offsets are 8-byte aligned so every view
    is aligned for its dtype.
    """

    fields: tuple[tuple[str, tuple[int, ...], str], ...]

    def layout(self, n: int) -> tuple[tuple[str, tuple[int, ...], np.dtype, int, int], ...]:
        return codec_layout(self.fields, n)

    def nbytes(self, n: int) -> int:
        name, shape, dt, off, nb = self.layout(n)[-1]
        return (off + nb + 7) // 8 * 8

    def alloc(self, n: int) -> np.ndarray:
        return np.zeros(self.nbytes(n), np.uint8)

    def pack(self, buf: np.ndarray, header: tuple[int, int, int, int], arrays: dict[str, np.ndarray]) -> None:
        n = len(next(iter(arrays.values())))
        buf[: HEADER * 8].view(np.int64)[:] = header
        for name, shape, dt, off, nb in self.layout(n):
            buf[off: off + nb].view(dt).reshape(shape)[...] = arrays[name]

    def header(self, buf: np.ndarray) -> tuple[int, ...]:
        return tuple(int(x) for x in buf[: HEADER * 8].view(np.int64))

    def unpack(self, buf: np.ndarray, n: int) -> dict[str, np.ndarray]:
        """Views into buf (no copy)."""
        return {name: buf[off: off + nb].view(dt).reshape(shape) for name, shape, dt, off, nb in self.layout(n)}


@functools.lru_cache(maxsize=256)
def codec_layout(fields: tuple, n: int) -> tuple[tuple[str, tuple[int, ...], np.dtype, int, int], ...]:
    """(name, shape, dtype, offset, bytes) of each field for n samples (cached: it is on every
    request's path, and a run has few group sizes)."""
    out, off = [], HEADER * 8
    for name, shape, dtype in fields:
        dt = np.dtype(dtype)
        nbytes = int(np.prod((n, *shape))) * dt.itemsize
        out.append((name, (n, *shape), dt, off, nbytes))
        off += (nbytes + 7) // 8 * 8
    return tuple(out)


def request_id(seq: int, t: int, segment_steps: int) -> int:
    """A group's requests numbered in order: step t of segment seq (t = segment_steps: the
    segment's bootstrap request). Keys the Generator's sampling noise."""
    return seq * (segment_steps + 1) + t


def obs_codec(spec) -> Codec:
    """Observation buffer of one group: images uint8 [n, cams, H, W, 3], proprio float32 [n, P],
    instruction tokens int32 [n, L]."""
    return Codec((
        ("images", (spec.cameras, spec.image_size, spec.image_size, 3), "uint8"),
        ("proprio", (spec.proprio_dim,), "float32"),
        ("tokens", (spec.instruction_len,), "int32"),
    ))


def action_codec(spec) -> Codec:
    """Reply buffer of one group: the env action chunk float32 [n, K, A], the policy's sample
    [n, ...] (token ids or denoising chain: policies.SampleLayout), logprob float32 [n], value
    float32 [n]. The header carries the producing version."""
    return Codec((
        ("action", (spec.chunk, spec.action_dim), "float32"),
        ("sample", spec.sample.shape, spec.sample.dtype),
        ("logprob", (), "float32"),
        ("value", (), "float32"),
    ))
