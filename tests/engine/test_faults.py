"""The fault-injection benchmark, short: real mpiexec ranks of the emulated engine with envs in
child processes; every fault kind's outcome and the final audit (rows lost / trained twice /
version numbers reused) must come out clean. `python -m rlvla3.bench faults --minutes 10` is
the long run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rlvla3.engine import faults


def test_an_armed_fault_point_kills_its_process_at_the_nth_visit_only():
    code = "from rlvla3.engine import faults\nfor i in range(5):\n    print(i, flush=True)\n    faults.reach('ckpt_save')\n"
    env = {**os.environ, faults.ENV_VAR: "ckpt_save:3"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL and p.stdout.split() == ["0", "1", "2"]
    p = subprocess.run([sys.executable, "-c", code], env={**env, faults.ENV_VAR: "ckpt_sav:3"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "RLVLA3_FAULT='ckpt_sav:3'" in p.stderr


@pytest.mark.slow
def test_bench_faults_short_run_loses_no_row_and_trains_none_twice(tmp_path):
    p = subprocess.run([sys.executable, "-m", "rlvla3.bench", "faults", "--minutes", "0.3", "--seed", "3",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-3000:]
    assert "rows lost: 0   rows trained twice: 0   version numbers reused: 0" in p.stdout
    assert "PASS" in p.stdout and "hung 0" in p.stdout and "orphan processes 0" in p.stdout
