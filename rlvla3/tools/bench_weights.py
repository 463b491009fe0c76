"""The weight-sync benchmark's MPI job (`python -m rlvla3.bench weights` starts it through mpiexec).

Rank 0 plays Trainer 0 and publishes over the engine's own WEIGHTS_BUF edges (engine/weights.py:
buckets, optional bfloat16 wire, the relay tree of world.relay_tree with the given fanout);
every other rank plays a Generator, receives from its parent, forwards to its children, decodes,
checks each value against the formula the publisher used and acknowledges on a benchmark-only
edge. A publish is timed from the start of encoding to the last Generator's acknowledgement.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..engine import weights
from ..engine.protocol import Tag
from ..engine.transport import MpiLink, Transport
from ..engine.wiring import EDGES, Edge, Wiring
from ..world import relay_tree

BENCH_ACK = 98   # a tag of this benchmark only: a Generator decoded the whole buffer


@dataclass(frozen=True)
class Decoded:
    max_abs_error: float


BENCH_EDGES = (*(e for e in EDGES if e.tag in (Tag.WEIGHTS_BUF, Tag.HEARTBEAT)),
               Edge("generator", "trainer0", BENCH_ACK, Decoded, "benchmark: the buffer arrived and was checked"))


def expected(sl: slice) -> np.ndarray:
    """The benchmark's parameters, computable anywhere: a sawtooth in [-5, 5)."""
    return ((np.arange(sl.start, sl.stop) % 1000) - 500).astype(np.float32) * np.float32(0.01)


def bench_wiring(rank: int, n: int, tree) -> Wiring:
    roles = {r: frozenset({"any", "trainer", "trainer0", "rank0"} if r == 0 else {"any", "generator", "relay"})
             for r in range(n)}
    parent, children = tree[rank]
    peers = tuple(range(1, n)) if rank == 0 else tuple(sorted({0, *children} | ({parent} if parent else set())))
    return Wiring(BENCH_EDGES, roles, rank, peers)


def bench_worker(sizes: list[int], dtypes: list[str], bucket_mb: float, reps: int, fanout: int) -> None:
    """One MPI job: rank 0 publishes, every other rank is a Generator. For each size and wire
    dtype, `reps` publishes are timed from the start of encoding to the last Generator's
    acknowledgement (its buffer decoded, compared with what was sent); rank 0 prints one JSON
    line per point with the median time and the largest error any Generator received."""
    from mpi4py import MPI

    try:  # the real Trainer and Generators have torch loaded: measure its bfloat16 path
        import torch  # noqa: F401
    except ImportError:
        pass
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    tree = relay_tree(n - 1, fanout)   # node i is rank i
    transport = Transport(MpiLink(comm), bench_wiring(rank, n, tree), 120.0, 1.0, 0.0001, 0.001)
    gens = list(range(1, n))
    for size in sizes:
        # Only the publisher holds the parameters; Generators check each value against the
        # formula, so 16 Generators of 100M parameters fit in memory.
        flat = expected(slice(0, size)) if rank == 0 else None
        out = np.empty(size, np.float32)
        for dtype in dtypes:
            wire = weights.wire_buffer(out, dtype)
            times, errors = [], []
            for _ in range(reps):
                comm.Barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    w = weights.to_wire(flat, dtype)
                    for d, req in weights.send(transport, tree[0][1], w, bucket_mb):
                        transport.wait(req, 600.0, d, "weights bucket")
                    for g in gens:
                        errors.append(transport.recv(g, BENCH_ACK, 600.0, "decoded-weights acknowledgement").max_abs_error)
                    times.append(time.perf_counter() - t0)
                else:
                    weights.receive(transport, tree[rank][0], wire, out, bucket_mb, 600.0, tuple(tree[rank][1]))
                    err = max(float(np.abs(out[sl] - expected(sl)).max()) for sl in weights.buckets(size, 4, 64.0))
                    transport.send(0, BENCH_ACK, Decoded(err))  # what arrived, checked
            if rank == 0:
                err = max(errors) / float(np.abs(flat).max())  # largest |received - sent|, relative
                print(json.dumps({"params": size, "generators": len(gens), "fanout": fanout, "dtype": dtype, "bucket_mb": bucket_mb,
                                  "seconds": sorted(times)[len(times) // 2], "bytes_per_generator": wire.nbytes,
                                  "max_rel_error": err}), flush=True)
    transport.flush(30.0)


if __name__ == "__main__":
    sizes, dtypes, bucket, reps, fanout = sys.argv[1:6]
    bench_worker([int(float(s)) for s in sizes.split(",")], dtypes.split(","), float(bucket), int(reps), int(fanout))
