"""Runs on this machine: every rank through mpiexec (`cluster=local`).

The command, the environment every rank gets, and the oversubscription warning; `run_local` is
what tests, benchmarks and tools call to run a whole job and wait for it.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .. import notices
from .compose import prepare_run_dir


def mpiexec_command(cfg, world_size: int, run_dir: Path) -> list[str]:
    c = cfg.cluster
    cmd = [c.mpiexec, *c.mpiexec_args]
    if os.geteuid() == 0 and "--allow-run-as-root" not in cmd:
        cmd.append("--allow-run-as-root")
    return [*cmd, "-n", str(world_size), sys.executable, "-m", "mpi4py", "-m", "rlvla3.engine.run", str(run_dir)]


def mpi_env() -> dict[str, str]:
    env = notices.console_env()   # the ranks' pseudo-terminal is not the user's console
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")   # idle ranks yield the core
    # Open MPI binds each rank to one core when a job has no more ranks than cores (here: a
    # collection's one rank), and a Simulator's env processes inherit the binding: 8 LIBERO envs
    # shared one core of two while the other idled. Ranks float; the OS spreads ranks and envs.
    env.setdefault("OMPI_MCA_hwloc_base_binding_policy", "none")
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")           # fast large tensor <-> numpy copies
    env.setdefault("OMP_NUM_THREADS", "1")
    # Each job's session directory under a base of its own: jobs started at once on one machine
    # (two local runs, a test worker beside another) shared Open MPI's /tmp/ompi.<host>.<uid>, and
    # one job's cleanup could take another's files with it: a rank that had finished then "exited
    # improperly" (PID 0) and failed its job. A short path: sockets live there.
    env.setdefault("OMPI_MCA_orte_tmpdir_base", session_base())
    return env


def session_base() -> str:
    """A fresh folder for one job's MPI session files, removed when this process exits."""
    path = tempfile.mkdtemp(prefix="rlvla3-mpi-")
    atexit.register(shutil.rmtree, path, True)
    return path


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
    """Run every rank through mpiexec on this machine; returns when the job ends. mpiexec starts
    in a session of its own, so neither the terminal's Ctrl-C nor the end of this process reaches
    its ranks: on `timeout`, Ctrl-C (KeyboardInterrupt) or SIGTERM to this process, every process
    of that session (each rank has its own process group, and env children their rank's) is killed
    before the exception goes on (SIGTERM: SystemExit 143)."""
    cfg, world = prepare_run_dir(cfg, Path(run_dir))
    cmd = mpiexec_command(cfg, world.size, Path(run_dir))
    kw = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True} if capture else {}
    with subprocess.Popen(cmd, env=mpi_env(), start_new_session=True, **kw) as proc, sigterm_exits():
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            kill_session(proc.pid)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@contextlib.contextmanager
def sigterm_exits():
    """While in the block, SIGTERM to this process raises SystemExit(143) (the exit status a
    SIGTERM'd process has) instead of ending it on the spot, so that cleanup code runs (main
    thread only: a signal handler cannot be set from another)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def session_procs(sid: int) -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every live process of session `sid` (Linux /proc)."""
    out = {}
    for d in os.scandir("/proc"):
        if not d.name.isdigit():
            continue
        try:
            fields = Path(d.path, "stat").read_text().rsplit(")", 1)[1].split()   # after "(comm)": state ppid pgrp sid
            if fields[0] != "Z" and int(fields[3]) == sid:
                out[int(d.name)] = (int(fields[1]), Path(d.path, "cmdline").read_bytes())
        except (OSError, IndexError, ValueError):
            continue   # gone meanwhile
    return out


def kill_session(sid: int, timeout: float = 30.0) -> int:
    """SIGKILL every process of session `sid` and wait until none is left (a rank's run-folder
    lock goes with it). Returns how many there were."""
    left = session_procs(sid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    while session_procs(sid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of session {sid} survive SIGKILL: {sorted(session_procs(sid))}")
        time.sleep(0.1)
    return len(left)
