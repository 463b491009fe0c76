"""Runs on this machine: every rank through mpiexec (`cluster=local`).

The command, the environment every rank gets, and the oversubscription warning; `run_local` is
what tests, benchmarks and tools call to run a whole job and wait for it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .compose import prepare_run_dir


def mpiexec_command(cfg, world_size: int, run_dir: Path) -> list[str]:
    c = cfg.cluster
    cmd = [c.mpiexec, *c.mpiexec_args]
    if os.geteuid() == 0 and "--allow-run-as-root" not in cmd:
        cmd.append("--allow-run-as-root")
    return [*cmd, "-n", str(world_size), sys.executable, "-m", "mpi4py", "-m", "rlvla3.engine.run", str(run_dir)]


def mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")   # idle ranks yield the core
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")           # fast large tensor <-> numpy copies
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def cpu_warning(cfg, world) -> str | None:
    """Ranks + env child processes vs cores: oversubscription makes every number noisy."""
    cores = cfg.cluster.cores or os.cpu_count() or 1
    children = 0 if world.in_process_envs else cfg.env.num_envs
    busy = world.size + children
    if busy > cores:
        return (f"warning: {world.size} ranks + {children} env processes on {cores} cores "
                f"(oversubscribed: throughput is shared, not parallel)")
    return None


def run_local(cfg, run_dir: Path, timeout: float | None = None, capture: bool = False) -> subprocess.CompletedProcess:
    """Run every rank through mpiexec on this machine; returns when the job ends."""
    cfg, world = prepare_run_dir(cfg, Path(run_dir))
    cmd = mpiexec_command(cfg, world.size, Path(run_dir))
    kw = {"capture_output": True, "text": True} if capture else {}
    return subprocess.run(cmd, env=mpi_env(), timeout=timeout, **kw)
