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

`python -m rlvla3.bench weights` measures the cost of a publish vs parameter count and
Generator count.
"""
from __future__ import annotations

import sys

import numpy as np

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


def buckets(n: int, itemsize: int, bucket_mb: float) -> list[slice]:
    """Contiguous slices of at most bucket_mb MiB covering [0, n)."""
    per = max(1, int(bucket_mb * 2**20) // itemsize)
    return [slice(i, min(i + per, n)) for i in range(0, n, per)]


def send(transport, dests, wire: np.ndarray, bucket_mb: float) -> list:
    """Start sending every bucket of `wire` to every destination; returns the requests."""
    from .protocol import Tag

    reqs = []
    for sl in buckets(wire.size, wire.itemsize, bucket_mb):
        for d in dests:
            reqs.append((d, transport.isend_buf(d, Tag.WEIGHTS_BUF, wire[sl])))
    return reqs


def receive(transport, src: int, wire: np.ndarray, out: np.ndarray, bucket_mb: float, timeout: float) -> None:
    """Receive the buckets of a publish into `wire` and decode each into `out` as it lands."""
    from .protocol import Tag

    for sl in buckets(wire.size, wire.itemsize, bucket_mb):
        req = transport.irecv_buf(src, Tag.WEIGHTS_BUF, wire[sl])
        transport.wait(req, timeout, src, f"weights bucket [{sl.start}:{sl.stop})")
        from_wire(wire[sl], out[sl])


# ---------------------------------------------------------------- benchmark (python -m rlvla3.bench weights)

def expected(sl: slice) -> np.ndarray:
    """The benchmark's parameters, computable anywhere: a sawtooth in [-5, 5)."""
    return ((np.arange(sl.start, sl.stop) % 1000) - 500).astype(np.float32) * np.float32(0.01)


ACK = 98  # benchmark-only tag: a Generator decoded the whole buffer

def bench_worker(sizes: list[int], dtypes: list[str], bucket_mb: float, reps: int) -> None:
    """One MPI job: rank 0 publishes, every other rank is a Generator. For each size and wire
    dtype, `reps` publishes are timed from the start of encoding to the last Generator's
    acknowledgement (its buffer decoded, compared with what was sent); rank 0 prints one JSON
    line per point with the median time and the largest error any Generator received."""
    import json
    import time

    from mpi4py import MPI

    from .transport import Transport

    try:  # the real Trainer and Generators have torch loaded: measure its bfloat16 path
        import torch  # noqa: F401
    except ImportError:
        pass
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    names = {r: "trainer0" if r == 0 else "generator" for r in range(n)}
    peers = tuple(range(1, n)) if rank == 0 else (0,)
    tr = Transport(comm, names, peers, 120.0, 1.0, 0.0001, 0.001)
    gens = list(range(1, n))
    for size in sizes:
        # Only the publisher holds the parameters; Generators check each value against the
        # formula, so 16 Generators of 100M parameters fit in memory.
        flat = expected(slice(0, size)) if rank == 0 else None
        out = np.empty(size, np.float32)
        for dtype in dtypes:
            wire = wire_buffer(out, dtype)
            times, errors = [], []
            for _ in range(reps):
                comm.Barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    w = to_wire(flat, dtype)
                    for d, req in send(tr, gens, w, bucket_mb):
                        tr.wait(req, 600.0, d, "weights bucket")
                    for g in gens:
                        errors.append(tr.recv(g, ACK, 600.0, "decoded-weights acknowledgement"))
                    times.append(time.perf_counter() - t0)
                else:
                    receive(tr, 0, wire, out, bucket_mb, 600.0)
                    err = max(float(np.abs(out[sl] - expected(sl)).max()) for sl in buckets(size, 4, 64.0))
                    tr.send(0, ACK, err)  # what arrived, checked
            if rank == 0:
                err = max(errors) / float(np.abs(flat).max())  # largest |received - sent|, relative
                print(json.dumps({"params": size, "generators": len(gens), "dtype": dtype, "bucket_mb": bucket_mb,
                                  "seconds": sorted(times)[len(times) // 2], "bytes_per_generator": wire.nbytes,
                                  "max_rel_error": err}), flush=True)
    tr.flush(30.0)


if __name__ == "__main__":
    sizes, dtypes, bucket, reps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    bench_worker([int(float(s)) for s in sizes.split(",")], dtypes.split(","), float(bucket), int(reps))
