"""Shared helpers: every engine test runs the real launcher (mpiexec, real ranks, real zarr)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlvla3.launch import compose, run_local

needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not installed (apt-get install openmpi-bin)")

# Small, fast settings for engine tests on the toy env.
TOY = ["+experiment=toy", "algo.max_versions=3", "runtime.tensorboard=false", "runtime.liveness_timeout=20"]


def run_engine(tmp_path: Path, overrides: list[str], timeout: float = 240, name: str = "run"):
    run_dir = tmp_path / name
    proc = run_local(compose(overrides), run_dir, timeout=timeout, capture=True)
    return proc, run_dir


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
