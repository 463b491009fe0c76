"""ManiSkill3 (SAPIEN, rendered by Mesa's lavapipe from bookworm-backports) under its own
interpreter (.venv-maniskill, scripts/setup_maniskill.sh): real PickCube steps as a Simulator
hosts them, and through the engine."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rlvla3.cluster.compose import compose
from rlvla3.envs import SOURCE_ROOT
from rlvla3.envs.hosting import make_vec_env
from rlvla3.policies.prompts import instruction_encoder
from tests.conftest import assert_ok, needs_mpi, run_engine

VENV_PYTHON = SOURCE_ROOT / ".venv-maniskill" / "bin" / "python"
needs_maniskill = pytest.mark.skipif(not VENV_PYTHON.exists(), reason="no .venv-maniskill: run bash "
                                     "scripts/setup_maniskill.sh (scripts/setup.sh does)")
pytestmark = [pytest.mark.sim, needs_maniskill]
MANISKILL = ["env=maniskill", "env.image_size=32", "env.num_envs=2"]


def wait(env, timeout: float = 300):
    import time

    deadline = time.monotonic() + timeout
    while not env.ready():
        assert time.monotonic() < deadline, "no result from the ManiSkill3 env process"
        time.sleep(0.01)
    return env.result()


def test_pickcube_renders_steps_and_one_seed_is_one_initial_state():
    cfg = compose(MANISKILL)
    env = make_vec_env(cfg, [0, 1], 0, auto_reset=False, encode=instruction_encoder(cfg.policy))
    try:
        env.start_reset(7)                  # both envs from one seed: one initial state
        first = wait(env)
        assert first.images.shape == (2, 1, 32, 32, 3) and first.images.dtype == np.uint8
        assert first.images.std() > 5, "a blank frame: the renderer drew nothing"
        assert np.array_equal(first.images[0], first.images[1]) and np.array_equal(first.proprio[0], first.proprio[1])
        assert first.proprio.shape == (2, 9) and first.instructions[0] == "pick up the cube and move it to the goal"
        moves = np.zeros((2, 1, 7), np.float32)
        moves[0, 0, 2] = 1.0                # env 0 lifts its hand, env 1 stays
        for _ in range(3):
            env.start_step(moves)
            out = wait(env)
        assert not np.array_equal(out.images[0], out.images[1]), "an action changed nothing in the frame"
        assert out.proprio[0][:7].tolist() != out.proprio[1][:7].tolist()
        assert not out.success.any() and (out.reward == 0).all()
    finally:
        env.close()


@needs_mpi
def test_the_engine_trains_on_real_maniskill_steps(tmp_path):
    proc, run = run_engine(tmp_path, [*MANISKILL, "policy=tiny", "policy.patch=8", "algo.segment_steps=8",
                                      "algo.rollout_batch=16", "algo.global_batch=16", "algo.micro_batch=16",
                                      "algo.max_versions=2", "runtime.tensorboard=false", "runtime.progress=false"],
                           timeout=400)
    assert_ok(proc)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["versions"] == 2
    assert sum(h["env_steps"] for h in summary["history"]) >= 32
