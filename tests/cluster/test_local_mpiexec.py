"""Ranks started on this machine the way the project starts them (cluster/local.py)."""
import json
import os
import subprocess
import sys

import pytest

from rlvla3.cluster.local import mpi_env
from rlvla3.config import ClusterConfig
from tests.conftest import needs_mpi

# Each rank prints the CPUs it and a child process of it (what a Simulator's env is) may run on.
REPORT = ("import json, os, subprocess, sys; child = subprocess.run([sys.executable, '-c', "
          "'import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))'], capture_output=True, text=True).stdout; "
          "print(json.dumps([sorted(os.sched_getaffinity(0)), json.loads(child)]))")


@needs_mpi
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: a rank bound to a core could not be told apart")
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_rank_and_its_env_processes_may_use_every_core(ranks):
    """Open MPI binds each rank to a core of its own when there are no more ranks than cores; a
    Simulator's env processes would then all share its one core (8 LIBERO envs on 1 core of 2)."""
    c = ClusterConfig()
    cmd = [c.mpiexec, *c.mpiexec_args, "--allow-run-as-root", "-n", str(ranks), sys.executable, "-c", REPORT]
    out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    allowed = sorted(os.sched_getaffinity(0))
    reports = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(reports) == ranks
    for rank_cpus, child_cpus in reports:
        assert rank_cpus == allowed and child_cpus == allowed, (reports, allowed)
