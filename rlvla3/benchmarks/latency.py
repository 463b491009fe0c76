"""`python -m rlvla3.bench latency`: the action request's round trip minus inference, and the CPU
that waiting costs, for each way an idle rank can wait, side by side in one run: sleep (polling
at growing intervals), doorbell (a wake-up per message), doorbell+expect (a rank also polls around
the moment it expects a message, runtime.expect_spin_us=500), doorbell+spin (polling for
runtime.spin_us after any work).

Each row is a real engine job (mpiexec, every role, credits, shards, weight publishes) on the
emulated workload with zero-cost inference and training, so what is left of a request's round
trip is the engine itself: the Simulator's send, the Generator noticing it, batching (B_max = 1:
no batching window), packing, the reply, the Simulator noticing that. Per request it is the
Simulator's `wait_action` span minus the Generator's median `infer` span (the forward and its
sampling noise). Topologies: 1 Simulator + 1 Generator (1 env), and 16 Simulators + 4
Generators (1 env each, 4 Simulators a Generator; on a 2-core machine 21 ranks share the cores,
which is the point: a rank that spins takes a core from one that works).

CPU per role is CPU-seconds over wall-seconds after start-up, averaged over that role's ranks;
the `idle` row runs 1 + 1 with envs that take `--idle-step-ms` a step, so the Generator and the
Trainer wait nearly all the time: their CPU is what an idle rank burns.

The `floor` rows are this machine's limit without the engine's work: two bare MPI processes
ping-pong a 256-byte buffer with a pause between rounds (as an env step makes one), each
waiting as an engine rank does (`Backoff` on the doorbell) or spinning on Iprobe: the round
trip of two wake-ups and nothing else.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..cluster.compose import compose
from ..cluster.local import run_local
from ..engine.metrics import read_spans, read_summaries
from .common import save_rows

WORKLOAD = ["env=emulated", "env.num_envs={envs}", "env.step_ms={step_ms}", "env.step_sigma=0", "env.reset_ms=1",
            "env.horizon=100000", "policy=emulated", "policy.infer_fixed_ms=0", "policy.infer_per_sample_ms=0",
            "policy.train_samples_per_s=1e7", "policy.weight_sync_ms=0", "policy.emulated_params=1000",
            "cluster.sim_ranks={sims}", "cluster.gen_ranks={gens}", "cluster.train_ranks=1",
            "sharding.groups_per_rank=1", "algo.segment_steps={T}", "algo.rollout_batch={rows}",
            "algo.global_batch={rows}", "algo.micro_batch={rows}", "algo.max_versions={versions}", "generator.b_max=1",
            "mode=async", "mode.eta=2", "runtime.tensorboard=false", "runtime.progress=false"]
WARMUP = 5   # requests left out per Simulator
TOPOLOGIES = {"1+1": (1, 1, 5.0), "16+4": (16, 4, 80.0)}
"""Simulators, Generators, env step (ms): both offer this machine ~200 requests/s (16 Simulators
at 5 ms would keep 2 cores saturated, and the rows would measure the run queue, not the path)."""
WAKE_ROWS = {"sleep": ["runtime.wake=sleep"], "doorbell": ["runtime.wake=doorbell"],
         "doorbell+expect": ["runtime.wake=doorbell", "runtime.expect_spin_us=500"],
         "doorbell+spin": ["runtime.wake=doorbell", "runtime.spin_us={spin_us}"]}
"""The benchmark's wake rows (--wakes) and their overrides: runtime.wake (config.WAKES) and its spin options."""


def workload(sims: int, gens: int, step_ms: float, requests: int) -> list[str]:
    """About `requests` action requests per Simulator: segments of 25 steps, one per rollout step."""
    T = 25
    return [o.format(envs=sims, step_ms=step_ms, sims=sims, gens=gens, T=T, rows=T * sims,
                     versions=max(2, requests // T)) for o in WORKLOAD]


def spans(run: Path, name: str) -> dict[int, list[float]]:
    """rank -> the durations (s) of its spans called `name`, in order."""
    out = defaultdict(list)
    for rank, _, rec in read_spans(run):
        if rec["n"] == name:
            out[rank].append(rec["d"])
    return out


def cpu_share(run: Path) -> dict[str, float]:
    """role -> mean CPU-seconds per wall-second of its ranks after start-up (1.0 = a whole core)."""
    by_role = defaultdict(list)
    for s in read_summaries(run):
        by_role[s["role"]].append(s["run_cpu_s"] / max(s["run_wall_s"], 1e-9))
    return {role: float(np.mean(v)) for role, v in by_role.items()}


def measure(run: Path, overrides: list[str], timeout: float) -> dict:
    cfg = compose(overrides)
    proc = run_local(cfg, run, timeout=timeout, capture=True)
    if proc.returncode != 0:
        raise RuntimeError(f"latency run {run.name} failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
    # A group's first requests wait for the Generator's first weights: start-up, not the path.
    waits = np.concatenate([np.asarray(v[WARMUP:]) for v in spans(run, "wait_action").values()])
    infer = np.median(np.concatenate([np.asarray(v) for v in spans(run, "infer").values()]))
    overhead = (waits - infer) * 1e3
    return {"requests": int(waits.size), "p50_ms": float(np.percentile(overhead, 50)),
            "p99_ms": float(np.percentile(overhead, 99)), "infer_ms": float(infer * 1e3), "cpu": cpu_share(run)}


def run(a) -> int:
    root = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-latency-"))
    wakes = a.wakes.split(",")
    bad = [w for w in wakes if w not in WAKE_ROWS]
    if bad:
        raise SystemExit(f"--wakes {','.join(bad)}: use any of {','.join(WAKE_ROWS)}")
    unknown = [t for t in a.topologies.split(",") if t not in TOPOLOGIES]
    if unknown:
        raise SystemExit(f"--topologies {','.join(unknown)}: use any of {','.join(TOPOLOGIES)}")
    cases = [(topo, a.step_ms or TOPOLOGIES[topo][2]) for topo in a.topologies.split(",")]
    cases.append(("idle", a.idle_step_ms))
    rows = []
    print(f"{'topology':9s} {'wake':14s} {'step ms':>7s} {'requests':>8s} {'p50 ms':>7s} {'p99 ms':>7s} {'infer ms':>8s}  "
          f"CPU per rank, % of a core")
    for topo, step_ms in cases:
        sims, gens, _ = TOPOLOGIES.get(topo, (1, 1, 0.0))
        requests = a.requests if topo != "idle" else max(50, int(a.idle_seconds * 1e3 / step_ms))
        for wake in wakes:
            ov = [*workload(sims, gens, step_ms, requests), *(o.format(spin_us=a.spin_us) for o in WAKE_ROWS[wake]), *a.overrides]
            r = {"topology": topo, "wake": wake, "step_ms": step_ms,
                 **measure(root / f"{topo.replace('+', 'p')}-{wake.replace('+', '-')}", ov, a.timeout)}
            rows.append(r)
            cpu = " ".join(f"{k}={v:.1%}" for k, v in sorted(r["cpu"].items()))
            print(f"{topo:9s} {wake:14s} {step_ms:7.1f} {r['requests']:8d} {r['p50_ms']:7.3f} {r['p99_ms']:7.3f} "
                  f"{r['infer_ms']:8.3f}  {cpu}", flush=True)
    for r in floor_rows(a):
        rows.append(r)
        print(f"{'floor':9s} {r['wake']:14s} {r['step_ms']:7.1f} {r['requests']:8d} {r['p50_ms']:7.3f} {r['p99_ms']:7.3f} "
              f"{0:8.3f}  (two bare processes, no engine)", flush=True)
    print(f"run folders: {root}")
    save_rows(a.out, "latency.json", rows)
    return 0


def floor_rows(a) -> list[dict]:
    """Two bare ranks (this module under mpiexec): the round trip with each way of waiting."""
    from ..cluster.local import mpi_env

    rows = []
    for how in ("doorbell", "spin"):
        cmd = ["mpiexec", "--oversubscribe", "-n", "2", sys.executable, "-m", "mpi4py", "-m", "rlvla3.benchmarks.latency",
               how, str(a.requests), str(a.step_ms or TOPOLOGIES["1+1"][2])]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=a.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"latency floor ({how}) failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{"))))
    return rows


def ping_pong(how: str, rounds: int, pause_ms: float) -> None:
    """(under mpiexec, 2 ranks) rank 0 pauses, sends, waits for the echo; prints the round trips."""
    from mpi4py import MPI

    from ..engine.doorbell import Doorbell
    from ..engine.transport import Backoff

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    bell = Doorbell()
    bell.connect(comm.allgather(bell.address()), rank)
    buf, peer = np.zeros(256, np.uint8), 1 - rank
    t_cpu = time.process_time()

    backoff = Backoff(0.0005, 0.05, wait=bell.wait)   # the engine's wait (runtime.idle_sleep, max_idle_wait)

    def receive():
        deadline = time.monotonic() + 60
        while not comm.Iprobe(source=peer, tag=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: no message from rank {peer} in 60 s")
            if how == "doorbell":
                backoff.idle()
        backoff.busy()
        comm.Recv(buf, source=peer, tag=1)

    trips = []
    for _ in range(rounds):
        if rank == 0:
            time.sleep(pause_ms / 1e3)
            t = time.perf_counter()
        else:
            receive()
        comm.Send(buf, dest=peer, tag=1)
        bell.ring(peer)
        if rank == 0:
            receive()
            trips.append(time.perf_counter() - t)
    cpu = comm.gather(time.process_time() - t_cpu)
    if rank == 0:
        ms = np.asarray(trips) * 1e3
        print(json.dumps({"topology": "floor", "wake": how, "step_ms": pause_ms, "requests": rounds,
                          "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                          "infer_ms": 0.0, "cpu_echo": cpu[1]}), flush=True)


if __name__ == "__main__":
    ping_pong(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
