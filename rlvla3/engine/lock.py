"""One job at a time per run folder: `<run>/.lock`, held by the job's rank 0 for its whole life.

Two jobs writing one run folder would interleave shards and overwrite each other's checkpoints.
Rank 0 takes an exclusive `flock` on the file and writes who holds it; the kernel drops the lock
when that process ends, however it ends, so a requeued job (or a resume after a crash) takes it
again. The launcher checks the lock before it starts any rank or submits any job.
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".lock"


class RunFolderBusy(RuntimeError):
    """Another job holds the run folder."""


class RunLock:
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunFolderBusy(f"run folder {self.path.parent} is in use by {holder}: wait for that job, "
                                "or give this run its own run_dir=") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} (job {os.environ.get('SLURM_JOB_ID', '-')}, "
                      f"since {time.strftime('%Y-%m-%d %H:%M:%S')})\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)   # closing drops the flock
            self.fd = None


def check_free(run_dir: str | Path) -> None:
    """Raise RunFolderBusy if a job holds `run_dir` now (the launcher's check)."""
    if (Path(run_dir) / LOCK_NAME).exists():
        RunLock(run_dir).acquire().release()
