"""Per-rank spans and scalars, written as JSON lines under <run>/metrics/rank<NNNN>.jsonl.

Records (one JSON object per line):
  {"k": "meta",   "rank", "role", "host", "machine", "cpus", "clock_offset"}   clock_offset: add to local time;
                  machine: the kernel's boot id (hosts that are one machine, as the local test
                  cluster's virtual nodes, share it and its cpus)
  {"k": "span",   "n": name, "t": start (wall, rank-0 clock), "d": seconds, ...extra}
  {"k": "scalar", "n": name, "v": value, "t": time, ...extra}
  {"k": "summary", "cpu_s", "cpu_children_s", "wall_s", "spans": {name: [count, seconds]},
   "run_cpu_s", "run_wall_s": the same from the end of start-up (`started`) on,
   "heavy_modules": [the HEAVY_MODULES this rank imported]}
Span names: sim_step, reset, wait_action, infer, batch_wait, train, load_shard, weight_sync,
shard_write, comm. `read_spans` reads them back (for analysis/ and the planner's profiles).
"""
from __future__ import annotations

import json
import os
import resource
import socket
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

HEAVY_MODULES = ("torch", "robosuite", "mujoco")
"""Recorded per rank at exit: Simulator ranks never import torch, emulated ranks import none."""



def machine_id() -> str:
    """The running kernel's boot id: one per machine, whatever host name a Slurm node gives it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()

class Metrics:
    def __init__(self, run_dir: str | Path, rank: int, role: str, clock_offset: float = 0.0):
        self.dir = Path(run_dir) / "metrics"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.role, self.offset = rank, role, clock_offset
        path = self.dir / f"rank{rank:04d}.jsonl"
        torn = path.exists() and path.stat().st_size and last_byte(path) != b"\n"
        self._f = open(path, "a", buffering=1 << 16)
        if torn:   # the previous attempt of this rank was killed mid-line: start ours on a fresh one
            self._f.write("\n")
        self._totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
        self._t_start = time.time()
        self._cpu0 = time.process_time()
        self._run0 = (self._cpu0, self._t_start)   # moved by `started`
        self._next_flush = time.monotonic() + 1.0
        self._write({"k": "meta", "rank": rank, "role": role, "host": socket.gethostname(), "machine": machine_id(),
                     "cpus": os.cpu_count(), "pid": os.getpid(), "clock_offset": clock_offset, "t": self.now()})

    def now(self) -> float:
        return time.time() + self.offset

    def _write(self, rec: dict) -> None:
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        if time.monotonic() > self._next_flush:
            self._f.flush()
            self._next_flush = time.monotonic() + 1.0

    def span(self, name: str, start: float, seconds: float, **extra) -> None:
        """A finished span; `start` is time.time() at its start (local clock)."""
        tot = self._totals[name]
        tot[0] += 1
        tot[1] += seconds
        self._write({"k": "span", "n": name, "t": start + self.offset, "d": seconds, **extra})

    @contextmanager
    def timed(self, name: str, **extra):
        t0 = time.time()
        p0 = time.perf_counter()
        try:
            yield
        finally:
            self.span(name, t0, time.perf_counter() - p0, **extra)

    def started(self) -> None:
        """Start-up (imports, env processes, models) is over: `run_cpu_s` counts from here."""
        self._run0 = (time.process_time(), time.time())

    def flush(self) -> None:
        """Write out what is buffered now (a record that must survive a kill right after it)."""
        self._f.flush()
        self._next_flush = time.monotonic() + 1.0

    def scalar(self, name: str, value: float, **extra) -> None:
        self._write({"k": "scalar", "n": name, "v": float(value), "t": self.now(), **extra})

    def close(self) -> dict:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary = {"k": "summary", "rank": self.rank, "role": self.role,
                   "cpu_s": time.process_time() - self._cpu0,
                   "cpu_children_s": children.ru_utime + children.ru_stime,
                   "wall_s": time.time() - self._t_start,
                   "run_cpu_s": time.process_time() - self._run0[0], "run_wall_s": time.time() - self._run0[1],
                   "spans": {k: list(v) for k, v in self._totals.items()},
                   "heavy_modules": [m for m in HEAVY_MODULES if m in sys.modules]}
        self._write(summary)
        self._f.close()
        return summary


def last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def file_records(path: Path):
    """Every record of one rank's metrics file, in order (its meta line starts each attempt)."""
    for line in Path(path).read_text().splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue   # the torn last line of a rank that was killed while writing it


def read_records(run_dir: str | Path, kind: str):
    """Every record of `kind` ("span", "scalar", "summary") of a run folder as (rank, role,
    record), rank by rank."""
    for f in sorted((Path(run_dir) / "metrics").glob("rank*.jsonl")):
        role = "?"
        for rec in file_records(f):
            if rec["k"] == "meta":
                role = rec["role"]
            elif rec["k"] == kind:
                yield int(f.stem[4:]), role, rec


def read_spans(run_dir: str | Path):
    """Every span of a run folder as (rank, role, record), rank by rank."""
    return read_records(run_dir, "span")


def read_summaries(run_dir: str | Path) -> list[dict]:
    """The exit summary of every rank that finished (rank order)."""
    return [rec for _, _, rec in read_records(run_dir, "summary")]


def read_history(run_dir: str | Path) -> list[dict]:
    """A run's per-version history: summary.json's, or for a run stopped before it wrote one, the
    same records rebuilt from the lead Trainer's per-version scalars (a version a resume trained
    again keeps its last record)."""
    run_dir = Path(run_dir)
    if (run_dir / "summary.json").is_file():
        return json.loads((run_dir / "summary.json").read_text())["history"]
    versions: dict[int, dict] = defaultdict(dict)
    for _, role, rec in read_records(run_dir, "scalar"):
        if role == "trainer" and "version" in rec:
            versions[rec["version"]][rec["n"]] = int(rec["v"]) if rec["n"] in COUNTS else rec["v"]
    return [{**versions[v], "version": v} for v in sorted(versions)]


COUNTS = ("env_steps", "rows_trained", "episodes", "env_errors", "staleness_max")
"""History fields that are counts (scalars are written as floats)."""


def steady_throughput(history: list[dict]) -> float:
    """Env steps/s over versions 2..N (the first version includes start-up)."""
    if len(history) < 2:
        return float("nan")
    steps = sum(h["env_steps"] for h in history[1:])
    return steps / (history[-1]["t"] - history[0]["t"])
