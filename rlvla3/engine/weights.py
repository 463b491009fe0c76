"""Weight sync at size: one flat parameter buffer from the leading Trainer to every Generator,
versioned, in buckets, optionally bfloat16 on the wire. numpy only (emulated ranks use it too).

- The flat float32 parameters are cut into buckets of at most `bucket_mb`; each bucket is one
  MPI message per Generator (never one per tensor). Buckets keep every message under MPI's
  int32 element count (2^31 - 1: a 3B-parameter model in one message would not fit) and let a
  receiver decode bucket k while bucket k + 1 is still in flight.
- bfloat16 on the wire halves the bytes: float32 rounded to its upper 16 bits (round to
  nearest even), widened back on receipt; relative error <= 2^-8.
- The header (protocol.WeightsHeader) says version, credits, size, wire dtype and bucket size;
  the buckets follow on Tag.WEIGHTS_BUF in order.
- A publish travels down a tree (`world.relay_tree`, `generator.weights_fanout`): Trainer 0 sends to
  its children only, and every Generator forwards each bucket to its own children as soon as it
  has it, so Trainer 0 sends `fanout` copies instead of one per Generator, and the copies down
  the tree overlap bucket by bucket (fanout 0: Trainer 0 sends to every Generator itself).

`python -m rlvla3.bench weights` (benchmarks/weights.py) measures the cost of a publish vs parameter count and
Generator count.
"""
from __future__ import annotations

import sys
import zlib

import numpy as np

from . import faults
from .protocol import Tag

WIRE_DTYPES = ("float32", "bfloat16")


def to_wire(flat: np.ndarray, dtype: str) -> np.ndarray:
    """float32 [n] -> what travels: float32 as is, or bfloat16 bits as uint16 [n]."""
    flat = np.ascontiguousarray(flat, np.float32)
    if dtype == "float32":
        return flat
    if dtype != "bfloat16":
        raise ValueError(f"weights dtype {dtype!r}: use one of {WIRE_DTYPES}")
    return bf16_bits_torch(flat) if "torch" in sys.modules else bf16_bits_numpy(flat)


def bf16_bits_numpy(flat: np.ndarray) -> np.ndarray:
    u = flat.view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))   # round to nearest even
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_bits_torch(flat: np.ndarray) -> np.ndarray:
    """The same bits (torch rounds to nearest even too), ~10x faster on a large buffer. Used
    only where torch is already loaded: emulated ranks never import it for this."""
    import torch

    return torch.from_numpy(flat).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def from_wire(wire: np.ndarray, out: np.ndarray) -> None:
    """Decode `wire` (float32 or bfloat16 bits) into the float32 buffer `out` (same length)."""
    if wire.dtype == np.float32:
        if not np.shares_memory(wire, out):
            out[:] = wire
    elif "torch" in sys.modules:
        import torch

        torch.from_numpy(out).copy_(torch.from_numpy(wire.view(np.int16)).view(torch.bfloat16))
    else:
        out.view(np.uint32)[:] = wire.astype(np.uint32) << np.uint32(16)


def wire_buffer(out: np.ndarray, dtype: str) -> np.ndarray:
    """Where the buckets land: `out` itself for float32 (no copy), else a bfloat16 buffer."""
    return out if dtype == "float32" else np.empty(out.size, np.uint16)


def fingerprint(wire: np.ndarray) -> int:
    """crc32 of at most 2**16 evenly strided values and the size: the same weights give the same
    fingerprint, and an optimizer step moves every parameter. Cheap at any model size, so every
    publish records it (python -m rlvla3.bench faults checks that a resumed version number is
    published with the very weights it named before)."""
    stride = max(1, wire.size >> 16)
    return zlib.crc32(np.ascontiguousarray(wire[::stride]).tobytes(), wire.size & 0xFFFFFFFF)


def buckets(n: int, itemsize: int, bucket_mb: float) -> list[slice]:
    """Contiguous slices of at most bucket_mb MiB covering [0, n)."""
    per = max(1, int(bucket_mb * 2**20) // itemsize)
    return [slice(i, min(i + per, n)) for i in range(0, n, per)]


def send(transport, dests, wire: np.ndarray, bucket_mb: float) -> list:
    """Start sending every bucket of `wire` to every destination; returns the requests."""
    reqs = []
    for i, sl in enumerate(buckets(wire.size, wire.itemsize, bucket_mb)):
        for d in dests:
            reqs.append((d, transport.isend_buf(d, Tag.WEIGHTS_BUF, wire[sl])))
        if i == 0:
            faults.reach("weight_publish")
    return reqs


def receive(transport, src: int, wire: np.ndarray, out: np.ndarray, bucket_mb: float, timeout: float,
            forward_to: tuple[int, ...] = ()) -> None:
    """Receive the buckets of a publish into `wire`, forward each to `forward_to` (this rank's
    children in the relay tree) as soon as it has landed, and decode it into `out`. Returns once
    every forward has completed: `wire` may then be reused."""
    forwards = []
    for sl in buckets(wire.size, wire.itemsize, bucket_mb):
        req = transport.irecv_buf(src, Tag.WEIGHTS_BUF, wire[sl])
        transport.wait(req, timeout, src, f"weights bucket [{sl.start}:{sl.stop})")
        forwards += [(d, transport.isend_buf(d, Tag.WEIGHTS_BUF, wire[sl])) for d in forward_to]
        from_wire(wire[sl], out[sl])
    for d, req in forwards:
        transport.wait(req, timeout, d, "weights bucket relayed")
