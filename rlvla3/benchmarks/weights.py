"""`python -m rlvla3.bench weights [--params 1e6,1e7,1e8] [--generators 1,4,16] [--methods relay,ibcast]`:
publish cost vs parameter and Generator count (`run`, which starts the MPI job of this module
through mpiexec).

The MPI job: rank 0 plays Trainer 0 and publishes; every other rank plays a Generator, receives,
decodes, checks each value against the formula the publisher used and acknowledges on a
benchmark-only edge. A publish is timed from the start of encoding to the last Generator's
acknowledgement. Two ways to move the buckets (engine/weights.py: buckets, optional bfloat16 wire):
- relay: the engine's own, point to point over WEIGHTS_BUF edges down the relay tree of
  world.relay_tree with the given fanout (each Generator forwards each bucket to its children);
- ibcast: MPI's non-blocking broadcast (`Ibcast`) of each bucket over a communicator of
  Trainer 0 and the Generators, the MPI library choosing the algorithm; receivers post one
  bucket at a time and test it, as a serving Generator would between batches. The engine does
  not use it: this row is what decides whether it should.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from ..engine import weights
from ..engine.protocol import Tag
from ..engine.transport import MpiLink, Transport
from ..engine.wiring import EDGES, Edge, Wiring
from ..world import relay_tree
from .common import save_rows


def run(a) -> int:
    """Publish cost (encode, bucketed MPI transfer to every Generator, decode) vs parameter count
    and Generator count, one mpiexec job per Generator count (the MPI job below)."""
    import subprocess

    from ..cluster.local import mpi_env

    rows = []
    print(f"{'params':>10s} {'gens':>5s} {'method':>6s} {'fanout':>6s} {'wire':9s} {'MiB/gen':>8s} {'seconds':>8s} {'GB/s in':>8s} "
          f"{'max rel err':>11s}")
    for g, method, fanout in publish_points(a.generators, a.methods, a.fanouts):
        cmd = ["mpiexec", "--oversubscribe", "-n", str(g + 1), sys.executable, "-m", "mpi4py", "-m", "rlvla3.benchmarks.weights",
               a.params, a.dtypes, str(a.bucket_mb), "3", str(fanout), method]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=a.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"weights bench with {g} Generators failed:\n{out.stderr[-3000:]}")
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                rows.append(r)
                gbps = r["bytes_per_generator"] * r["generators"] / r["seconds"] / 1e9
                print(f"{r['params']:10.0e} {r['generators']:5d} {r['method']:>6s} {r['fanout']:6d} {r['dtype']:9s} "
                      f"{r['bytes_per_generator'] / 2**20:8.1f} "
                      f"{r['seconds']:8.3f} {gbps:8.2f} {r['max_rel_error']:11.2e}", flush=True)
    print(broadcast_check([r for r in rows if r["method"] == "relay"], a.bucket_mb))
    save_rows(a.out, "weights.json", rows)
    return 0


METHODS = ("relay", "ibcast")


def publish_points(generators: str, methods: str, fanouts: str) -> list[tuple[int, str, int]]:
    """(Generators, method, fanout) of each MPI job: the relay tree at every fanout, Ibcast once
    (it has no fanout: -1); one Generator only once (every way is the same single send)."""
    points = []
    for g in (int(x) for x in generators.split(",")):
        for method in methods.split(","):
            if method not in METHODS:
                raise SystemExit(f"--methods {methods}: {method!r} is not one of {', '.join(METHODS)}")
            for fanout in ([int(f) for f in fanouts.split(",")] if method == "relay" else [-1]):
                if g == 1 and any(p[0] == 1 for p in points):
                    continue
                points.append((g, method, fanout))
    return points


def broadcast_check(rows: list[dict], bucket_mb: float) -> str:
    """The planner's broadcast term (planner/network.py) against the measured publishes. Two
    numbers of the site are fitted per size and wire, the rest predicted: the link bandwidth from
    the 1-Generator publish (bytes / seconds), and the bisection (how much all copies together
    move: on one node each copy takes a core) from the smallest flat (fanout 0) publish to several
    Generators, marked. On one node a flat publish is pulled by its receivers in parallel (no
    sender NIC), which the model, written for a cluster, does not have."""
    import dataclasses

    from ..cluster.compose import CONF_DIR
    from ..planner.network import broadcast_ms
    from ..planner.profile import load_profile

    base = load_profile(CONF_DIR / "profile/emulated_validation.yaml")
    lines = ["planner broadcast model (link bandwidth from the 1-Generator row, bisection from the first flat row):",
             f"{'params':>10s} {'gens':>5s} {'fanout':>6s} {'wire':9s} {'measured s':>10s} {'model s':>8s} {'error':>7s}"]
    for key in dict.fromkeys((r["params"], r["dtype"]) for r in rows):
        same = [r for r in rows if (r["params"], r["dtype"]) == key]
        one = next((r for r in same if r["generators"] == 1), None)
        flat = min((r for r in same if r["generators"] > 1 and r["fanout"] == 0), key=lambda r: r["generators"], default=None)
        if one is None or flat is None:
            continue
        size = one["bytes_per_generator"]
        prof = dataclasses.replace(base, weights_mb=size / 1e6, net_gbps=size / one["seconds"] / 1e9,
                                   net_bisection_gbps=flat["generators"] * size / flat["seconds"] / 1e9)
        for r in same:
            if r["generators"] == 1:
                continue
            r["model_seconds"] = broadcast_ms(prof, r["generators"], r["fanout"], bucket_mb * 2**20 / 1e6) / 1e3
            mark = "   (bisection fitted here)" if r is flat else ""
            lines.append(f"{r['params']:10.0e} {r['generators']:5d} {r['fanout']:6d} {r['dtype']:9s} {r['seconds']:10.3f} "
                         f"{r['model_seconds']:8.3f} {r['model_seconds'] / r['seconds'] - 1:+7.0%}{mark}")
    return "\n".join(lines)

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


def bench_worker(sizes: list[int], dtypes: list[str], bucket_mb: float, reps: int, fanout: int, method: str) -> None:
    """One MPI job: rank 0 publishes, every other rank is a Generator, the buckets moved by
    `method` (the module's docstring). For each size and wire
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
    tree = relay_tree(n - 1, max(fanout, 0))   # node i is rank i
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
                    if method == "ibcast":
                        ibcast_send(comm, w, bucket_mb)
                    else:
                        for d, req in weights.send(transport, tree[0][1], w, bucket_mb):
                            transport.wait(req, 600.0, d, "weights bucket")
                    for g in gens:
                        errors.append(transport.recv(g, BENCH_ACK, 600.0, "decoded-weights acknowledgement").max_abs_error)
                    times.append(time.perf_counter() - t0)
                else:
                    if method == "ibcast":
                        ibcast_receive(comm, wire, out, bucket_mb, transport)
                    else:
                        weights.receive(transport, tree[rank][0], wire, out, bucket_mb, 600.0, tuple(tree[rank][1]))
                    err = max(float(np.abs(out[sl] - expected(sl)).max()) for sl in weights.buckets(size, 4, 64.0))
                    transport.send(0, BENCH_ACK, Decoded(err))  # what arrived, checked
            if rank == 0:
                err = max(errors) / float(np.abs(flat).max())  # largest |received - sent|, relative
                print(json.dumps({"params": size, "generators": len(gens), "method": method, "fanout": fanout, "dtype": dtype,
                                  "bucket_mb": bucket_mb,
                                  "seconds": sorted(times)[len(times) // 2], "bytes_per_generator": wire.nbytes,
                                  "max_rel_error": err}), flush=True)
    transport.flush(30.0)


def ibcast_send(comm, wire: np.ndarray, bucket_mb: float, timeout: float = 600.0) -> None:
    """The root's side: every bucket's Ibcast posted at once, then completed (Trainer 0 would
    train on between its Tests)."""
    from mpi4py import MPI

    reqs = [comm.Ibcast(wire[sl], root=0) for sl in weights.buckets(wire.size, wire.itemsize, bucket_mb)]
    deadline = time.monotonic() + timeout
    while not MPI.Request.Testall(reqs):
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ibcast of {len(reqs)} buckets did not complete within {timeout:.0f}s")
        time.sleep(0.0001)


def ibcast_receive(comm, wire: np.ndarray, out: np.ndarray, bucket_mb: float, transport, timeout: float = 600.0) -> None:
    """A Generator's side: one bucket's Ibcast posted at a time and tested (a Generator that
    serves would forward a batch between two Tests), each decoded as it lands."""
    for sl in weights.buckets(wire.size, wire.itemsize, bucket_mb):
        req = comm.Ibcast(wire[sl], root=0)
        deadline = time.monotonic() + timeout
        while not req.Test():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {comm.Get_rank()}: an Ibcast bucket did not land within {timeout:.0f}s")
            transport.tick()   # heartbeats, as the relay's receive keeps them
            transport.backoff.idle()
        weights.from_wire(wire[sl], out[sl])


if __name__ == "__main__":
    sizes, dtypes, bucket, reps, fanout, method = sys.argv[1:7]
    bench_worker([int(float(s)) for s in sizes.split(",")], dtypes.split(","), float(bucket), int(reps), int(fanout), method)
