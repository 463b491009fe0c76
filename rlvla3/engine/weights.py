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
- Nobody waits for a publish: Trainer 0 posts its sends and trains on (`send`; it completes them
  before the next publish), and a Generator receives the next version (`Incoming`) into a
  buffer of its own while it serves with the current one, swapping between batches once every
  bucket has landed and been relayed.

`python -m rlvla3.bench weights` (benchmarks/weights.py) measures the cost of a publish vs parameter count and
Generator count.
"""
from __future__ import annotations

import sys
import time
import zlib

import numpy as np

from . import faults
from .protocol import Tag
from .transport import PeerSilent

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


class Incoming:
    """A publish being received beside serving, one bucket at a time: `progress()` never waits;
    when the bucket in flight has landed it forwards it to `forward_to` (this rank's children in
    the relay tree), decodes it into `out`, posts the next bucket's receive and returns, so the
    rank serves between buckets. (On one node Open MPI copies a large message inside the call
    that matches it: posting every receive at once would copy the whole version in one call.)
    A parent that delivers no bucket, or a child that takes none, for `timeout` seconds is named."""

    def __init__(self, transport, src: int, wire: np.ndarray, out: np.ndarray, bucket_mb: float, timeout: float,
                 forward_to: tuple[int, ...] = ()):
        self.t0, self.moved = time.time(), time.monotonic()
        self.transport, self.src, self.wire, self.out = transport, src, wire, out
        self.timeout, self.forward_to = timeout, forward_to
        self.slices = buckets(wire.size, wire.itemsize, bucket_mb)
        self.landed = 0
        self.req = transport.irecv_buf(src, Tag.WEIGHTS_BUF, wire[self.slices[0]])
        self.forwards: list[tuple[int, object]] = []

    def progress(self) -> bool:
        """True once every bucket has landed, been decoded, and every forward has completed (then
        `wire` may be reused)."""
        if self.landed < len(self.slices):
            if not self.req.Test():
                self._check(self.src, f"weights bucket {self.landed} of {len(self.slices)} from")
                return False
            sl = self.slices[self.landed]
            self.forwards += [(d, self.transport.isend_buf(d, Tag.WEIGHTS_BUF, self.wire[sl])) for d in self.forward_to]
            from_wire(self.wire[sl], self.out[sl])
            self.landed += 1
            self.moved = time.monotonic()
            if self.landed < len(self.slices):
                self.req = self.transport.irecv_buf(self.src, Tag.WEIGHTS_BUF, self.wire[self.slices[self.landed]])
                return False
        self.forwards = [(d, r) for d, r in self.forwards if not r.Test()]
        if self.forwards:
            self._check(self.forwards[0][0], "weights bucket relayed to")
        return not self.forwards

    def _check(self, peer: int, what: str) -> None:
        if time.monotonic() - self.moved > self.timeout:
            raise PeerSilent(f"rank {self.transport.rank}: {what} {self.transport.who(peer)} did not complete "
                             f"within {self.timeout:.0f}s")


def receive(transport, src: int, wire: np.ndarray, out: np.ndarray, bucket_mb: float, timeout: float,
            forward_to: tuple[int, ...] = ()) -> None:
    """An `Incoming` publish, waited for (the weights benchmark times a publish this way)."""
    incoming = Incoming(transport, src, wire, out, bucket_mb, timeout, forward_to)
    while not incoming.progress():
        transport.tick()
        transport.backoff.idle()
