"""Envs behind one interface; child env processes are killed and restarted, never hang the run."""
import os
import signal
import time

import numpy as np
import pytest

from rlvla3.envs import make_vec_env, spec, tokenize
from rlvla3.launch import compose


def drive(vec, actions, timeout=60.0):
    vec.start_step(actions)
    deadline = time.monotonic() + timeout
    while not vec.ready():
        assert time.monotonic() < deadline, "env group did not answer"
        time.sleep(0.005)
    return vec.result()


def reset(vec, timeout=120.0):
    vec.start_reset()
    deadline = time.monotonic() + timeout
    while not vec.ready():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return vec.result()


def test_toy_group_shapes_seeds_and_instruction():
    cfg = compose(["+experiment=toy"])
    sp = spec(cfg)
    a, b = make_vec_env(cfg, [0, 1, 2], seed=5), make_vec_env(cfg, [0, 1, 2], seed=5)
    oa, ob = reset(a), reset(b)
    assert oa.images.shape == (3, 1, sp.image_size, sp.image_size, 3) and oa.images.dtype == np.uint8
    assert oa.proprio.shape == (3, sp.proprio_dim) and oa.tokens.shape == (3, sp.instruction_len)
    np.testing.assert_array_equal(oa.images, ob.images)           # per-env seeds: reproducible
    assert not (oa.images[0] == oa.images[1]).all()               # and different across envs
    names = [e.env.goal for e in a.eps]
    np.testing.assert_array_equal(oa.tokens[0], tokenize(f"go to the {names[0]} square", sp.instruction_len, sp.vocab))


def test_toy_episode_truncates_at_horizon_and_autoresets():
    cfg = compose(["+experiment=toy", "env.horizon=3"])
    g = make_vec_env(cfg, [0], seed=0)
    reset(g)
    flags = [drive(g, np.zeros((1, 2), np.float32)) for _ in range(3)]   # standing still never succeeds
    assert [bool(f.truncated[0]) for f in flags] == [False, False, True]
    assert g.eps[0].t == 0 and g.eps[0].episode == 2


def test_env_exception_truncates_and_is_counted():
    cfg = compose(["+experiment=toy"])
    g = make_vec_env(cfg, [0, 1], seed=0)
    reset(g)

    def boom(action):
        raise RuntimeError("simulator exploded")
    g.eps[1].env.step = boom
    out = drive(g, np.zeros((2, 2), np.float32))
    assert out.errors == 1 and bool(out.truncated[1]) and not bool(out.truncated[0])


def test_emulated_latency_is_waited_without_cpu():
    cfg = compose(["env=emulated", "env.step_ms=50", "env.step_sigma=0.0", "env.num_envs=4"])
    g = make_vec_env(cfg, [0, 1, 2, 3], seed=0)
    reset(g)
    c0, t0 = time.process_time(), time.monotonic()
    drive(g, np.zeros((4, 7), np.float32))
    assert time.monotonic() - t0 >= 0.05
    assert time.process_time() - c0 < 0.04


@pytest.mark.sim
def test_robosuite_lift_child_process_steps_and_restarts_after_kill():
    pytest.importorskip("robosuite", reason="robosuite not installed (pip install --no-deps robosuite==1.5.2)")
    cfg = compose(["env.num_envs=1", "env.step_timeout=30"])
    g = make_vec_env(cfg, [0], seed=0)
    try:
        first = reset(g)
        assert first.images.shape == (1, 1, 64, 64, 3) and first.images.std() > 5   # a real rendered frame
        assert first.proprio.shape == (1, 9)
        out = drive(g, np.zeros((1, 7), np.float32))
        assert not out.truncated[0] and out.errors == 0
        os.kill(g.procs[0].pid, signal.SIGKILL)                  # a crashed simulator ...
        out = drive(g, np.zeros((1, 7), np.float32), timeout=120)
        assert out.errors == 1 and bool(out.truncated[0])       # ... is restarted, its episode cut
        assert g.restarts[0] == 1 and g.procs[0].is_alive()
        out = drive(g, np.zeros((1, 7), np.float32))
        assert out.errors == 0
    finally:
        g.close()
