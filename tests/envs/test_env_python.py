"""Envs under another interpreter (`env.python`): the numpy-only wire format, a real second
virtual environment hosting the env's child processes, and the checks before any rank starts."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rlvla3.cluster.compose import compose, prepare_run_dir
from rlvla3.config import ConfigError
from rlvla3.envs.base import Obs, StepOut
from rlvla3.envs.hosting import ProcessVecEnv, check_env
from rlvla3.envs.wire import decode, encode, namespace
from rlvla3.policies.prompts import instruction_encoder


def test_wire_round_trips_the_env_messages_without_pickle():
    obs = Obs(np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3), np.array([0.5, -1.0], np.float32), "pick it")
    out = StepOut(obs, 1.5, True, False, True, False, 0.01, 0.0, 0.0, 3, np.ones((3, 7), np.float32))
    for msg in (("step", np.zeros(7, np.float32)), ("reset", None), ("reset", 12), ("close",), out,
                {"cfg": {"env": {"cameras": ["agentview", "wrist"], "task": "x"}}, "seed": np.int64(3)}):
        data = encode(msg)
        assert b"numpy" not in data and b"pickle" not in data
        back = decode(data)
        if isinstance(msg, StepOut):
            assert np.array_equal(back.obs.images, obs.images) and back.obs.images.dtype == np.uint8
            assert np.array_equal(back.actions, msg.actions) and back.obs.instruction == "pick it"
            assert (back.reward, back.terminated, back.success, back.steps) == (1.5, True, True, 3)
        elif isinstance(msg, tuple):
            assert type(back) is tuple and back[0] == msg[0] and len(back) == len(msg)
        else:
            assert back["seed"] == 3 and namespace(back["cfg"]).env.cameras == ["agentview", "wrist"]
    with pytest.raises(TypeError, match="cannot send a set"):
        encode({"x": {1, 2}})


def make_venv(path, system_site: bool) -> str:
    args = [sys.executable, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []), str(path)]
    subprocess.run(args, check=True, timeout=120)
    return str(path / "bin" / "python")


def wait_ready(g: ProcessVecEnv, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not g.ready():
        assert time.monotonic() < deadline, "env group not ready"
        time.sleep(0.01)
    return g.result()


def test_an_env_runs_under_another_interpreter_and_is_restarted_there(tmp_path):
    python = make_venv(tmp_path / "venv", system_site=True)
    cfg = compose(["+experiment=toy", f"env.python={python}"])
    check_env(cfg)
    g = ProcessVecEnv(cfg, [0, 1], 0, True, instruction_encoder(cfg.policy))
    try:
        first = wait_ready((g.start_reset(7), g)[1])
        assert first.images.shape[:2] == (2, 1) and first.images.dtype == np.uint8
        for p in g.procs:   # each child is the other interpreter, running our worker
            cmd = open(f"/proc/{p.pid}/cmdline", "rb").read().split(b"\0")
            assert cmd[0].decode() == python and b"rlvla3.envs.worker" in cmd
        g.start_step(np.zeros((2, 1, 2), np.float32))
        assert wait_ready(g).errors == 0
        pid = g.procs[0].pid
        os.kill(pid, signal.SIGUSR2)          # Slurm's warning: ignored there as well
        time.sleep(0.5)
        assert g.procs[0].is_alive()
        os.kill(pid, signal.SIGKILL)
        g.procs[0].join(timeout=10)
        g.start_step(np.zeros((2, 1, 2), np.float32))
        out = wait_ready(g)
        assert out.errors == 1 and g.procs[0].pid != pid and g.procs[0].is_alive()
    finally:
        g.close()


def test_a_bad_env_python_is_refused_before_any_rank_starts(tmp_path):
    with pytest.raises(ConfigError, match="env.python.*no such file"):
        prepare_run_dir(compose(["+experiment=toy", f"env.python={tmp_path}/nope/bin/python"]), tmp_path / "r1")
    bare = make_venv(tmp_path / "bare", system_site=False)   # no numpy, no simulator
    with pytest.raises(ConfigError, match=r"cannot host env.name='robosuite'.*No module named 'numpy'"):
        prepare_run_dir(compose([f"env.python={bare}"]), tmp_path / "r2")
    assert not (tmp_path / "r2").exists()
