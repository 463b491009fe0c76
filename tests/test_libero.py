"""LIBERO with its real assets, under its own interpreter (.venv-libero, scripts/setup_libero.sh):
the adapter's observation and success wiring, and LIBERO rollouts through the engine."""
from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from rlvla3.cluster.compose import compose, prepare_run_dir
from rlvla3.config import ConfigError
from rlvla3.envs import SOURCE_ROOT
from rlvla3.envs.wire import config_tree
from tests.conftest import assert_ok, needs_mpi, run_engine

VENV_PYTHON = SOURCE_ROOT / ".venv-libero" / "bin" / "python"
needs_libero = pytest.mark.skipif(not VENV_PYTHON.exists(), reason="no .venv-libero: run bash scripts/setup_libero.sh "
                                  "(scripts/setup.sh does)")
pytestmark = [pytest.mark.sim, needs_libero]


def in_libero(cfg, body: str, timeout: float = 300) -> dict:
    """Run `body` in LIBERO's interpreter with `env` = our LiberoEnv of `cfg`; it prints a JSON line."""
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        from rlvla3.envs.libero_env import LiberoEnv, NO_OP
        from rlvla3.envs.wire import namespace
        env = LiberoEnv(namespace(json.loads(sys.argv[1])).env)
    """) + textwrap.dedent(body)
    p = subprocess.run([str(VENV_PYTHON), "-c", code, json.dumps(config_tree(cfg))], capture_output=True, text=True,
                       timeout=timeout, env={"PYTHONPATH": str(SOURCE_ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_success_is_the_goal_zero_actions_are_not_and_a_seed_is_one_initial_state():
    """One LIBERO process (each costs ~20 s to start), libero_object tasks 0 and 1. Success: the
    alphabet soup dropped into the basket from above (privileged state) reaches task 0's goal,
    the same episode with the arm still does not. Initial states: one seed is one state (a GRPO
    group), the seed picks the task, env.init_states=fixed takes the suite's fixed state."""
    cfg = compose(["env=libero", "env.suite=libero_object", "env.task_ids=[0,1]", "env.image_size=64",
                   "env.cameras=[agentview]", "env.init_states=fixed", "env.settle_steps=0"])
    got = in_libero(cfg, """
        obs = env.reset(0)          # task 0, fixed state 0 (no settle steps: the state as set)
        fixed = env.env.env.sim.get_state().flatten()
        want = env.suite.get_task_init_states(0)[0]
        still = [env.step(NO_OP)[2] for _ in range(15)]
        inner = env.env.env
        soup = inner.objects_dict["alphabet_soup_1"].joints[0]
        basket = inner.sim.data.body_xpos[inner.obj_body_id["basket_1"]].copy()
        inner.sim.data.set_joint_qpos(soup, np.concatenate([basket + [0, 0, 0.08], [1, 0, 0, 0]]))
        inner.sim.data.set_joint_qvel(soup, np.zeros(6))
        inner.sim.forward()
        dropped = [env.step(NO_OP)[2] for _ in range(40)]
        env.c.init_states = "sampled"
        state = lambda seed: (env.reset(seed), env.env.env.sim.get_state().flatten()[1:])[1]   # [0] is the time
        a, b, c = state(4), state(4), state(6)
        other = env.reset(5).instruction   # task 5 % 2 = 1
        print(json.dumps({"images": list(obs.images.shape), "proprio": list(obs.proprio.shape),
                          "instruction": obs.instruction, "still": any(still), "dropped": any(dropped),
                          "fixed": bool(np.allclose(fixed[:len(want)], want, atol=1e-6)),
                          "same": bool(np.allclose(a, b)), "differs": not np.allclose(a, c), "other": other}))
    """)
    assert got["images"] == [1, 64, 64, 3] and got["proprio"] == [8]
    assert got["instruction"] == "pick up the alphabet soup and place it in the basket"
    assert not got["still"] and got["dropped"], got
    assert got["fixed"] and got["same"] and got["differs"], got
    assert got["other"] != got["instruction"], got


def test_bad_libero_settings_are_refused_before_any_rank_starts(tmp_path):
    for override, field in [("env.suite=libero_100", "env.suite"), ("env.task_ids=[10]", "env.task_ids"),
                            ("env.task_ids=[]", "env.task_ids"), ("env.cameras=[frontview]", "env.cameras"),
                            ("env.python=", "env.python"), ("env.init_states=random", "env.init_states")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            prepare_run_dir(compose(["env=libero", override]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


@needs_mpi
@pytest.mark.slow
def test_libero_rollouts_through_the_engine(tmp_path):
    """A whole run on libero_spatial: Simulator ranks host LIBERO envs under .venv-libero's
    interpreter, the tiny VLA acts on both cameras, shards hold LIBERO's images and proprio."""
    import numpy as np

    from rlvla3.engine import shards

    proc, run = run_engine(tmp_path, [
        "env=libero", "env.num_envs=2", "env.image_size=64", "env.horizon=16", "env.settle_steps=2",
        "policy=tiny", "policy.patch=16", "algo.segment_steps=8", "algo.rollout_batch=16", "algo.global_batch=16",
        "algo.micro_batch=16", "algo.max_versions=1", "runtime.tensorboard=false"], timeout=600)
    assert_ok(proc)
    names = shards.scan(run / "shards")
    arrays, attrs = shards.read_shard(run / "shards" / names[0])
    assert arrays["images"].shape[2:] == (2, 64, 64, 3) and arrays["proprio"].shape[-1] == 8
    assert arrays["actions"].shape[-1] == 7 and attrs["env"] == "libero"
    assert np.ptp(arrays["proprio"][:, :, :3]) > 0   # the arm moved
