"""Envs behind one interface; child env processes are killed and restarted, never hang the run."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rlvla3.cluster.compose import compose
from rlvla3.envs.hosting import make_vec_env
from rlvla3.policies.prompts import hashed_words, instruction_encoder
from rlvla3.world import spec


def words(cfg):
    """The policy's instruction encoder, as the Simulator builds it."""
    return instruction_encoder(cfg.policy)


def drive(vec, actions, timeout=60.0):
    vec.start_step(actions)
    deadline = time.monotonic() + timeout
    while not vec.ready():
        assert time.monotonic() < deadline, "env group did not answer"
        time.sleep(0.005)
    return vec.result()


def reset(vec, timeout=120.0, seed=None):
    vec.start_reset(seed)
    deadline = time.monotonic() + timeout
    while not vec.ready():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return vec.result()


def test_toy_group_shapes_seeds_and_instruction():
    cfg = compose(["+experiment=toy"])
    sp = spec(cfg)
    a, b = (make_vec_env(cfg, [0, 1, 2], seed=5, auto_reset=True, encode=words(cfg)) for _ in range(2))
    oa, ob = reset(a), reset(b)
    assert oa.images.shape == (3, 1, sp.image_size, sp.image_size, 3) and oa.images.dtype == np.uint8
    assert oa.proprio.shape == (3, sp.proprio_dim) and oa.tokens.shape == (3, sp.instruction_len)
    np.testing.assert_array_equal(oa.images, ob.images)           # per-env seeds: reproducible
    assert not (oa.images[0] == oa.images[1]).all()               # and different across envs
    names = [e.env.goal for e in a.eps]
    np.testing.assert_array_equal(oa.tokens[0], hashed_words(f"go to the {names[0]} square", sp.instruction_len, sp.vocab))


def test_toy_episode_truncates_at_horizon_and_autoresets():
    cfg = compose(["+experiment=toy", "env.horizon=3"])
    g = make_vec_env(cfg, [0], seed=0, auto_reset=True, encode=words(cfg))
    reset(g)
    flags = [drive(g, np.zeros((1, 2), np.float32)) for _ in range(3)]   # standing still never succeeds
    assert [bool(f.truncated[0]) for f in flags] == [False, False, True]
    assert g.eps[0].t == 0 and g.eps[0].episode == 2


def test_env_exception_truncates_and_is_counted():
    cfg = compose(["+experiment=toy"])
    g = make_vec_env(cfg, [0, 1], seed=0, auto_reset=True, encode=words(cfg))
    reset(g)

    def boom(action):
        raise RuntimeError("simulator exploded")
    g.eps[1].env.step = boom
    out = drive(g, np.zeros((2, 2), np.float32))
    assert out.errors == 1 and bool(out.truncated[1]) and not bool(out.truncated[0])


def test_emulated_latency_is_waited_without_cpu():
    cfg = compose(["env=emulated", "env.step_ms=50", "env.step_sigma=0.0", "env.num_envs=4"])
    g = make_vec_env(cfg, [0, 1, 2, 3], seed=0, auto_reset=True, encode=words(cfg))
    reset(g)
    c0, t0 = time.process_time(), time.monotonic()
    drive(g, np.zeros((4, 7), np.float32))
    assert time.monotonic() - t0 >= 0.05
    assert time.process_time() - c0 < 0.04


def seeded_first_frames(overrides: list[str], action_dim: int) -> np.ndarray:
    """Reset two env processes with one seed, step, reset again, and reset with another seed;
    checks that a reset is a function of its seed alone (in any process: grpo groups share one
    initial state) and returns the first frame [H, W, 3]."""
    cfg = compose(["env.num_envs=2", *overrides])
    g = make_vec_env(cfg, [0, 1], seed=0, auto_reset=True, encode=words(cfg))
    try:
        a = reset(g, seed=7)
        drive(g, np.random.default_rng(0).uniform(-1, 1, (2, action_dim)).astype(np.float32))
        b = reset(g, seed=7)
        c = reset(g, seed=8)
    finally:
        g.close()
    assert np.array_equal(a.images, b.images) and np.array_equal(a.proprio, b.proprio)   # seed -> state
    assert np.array_equal(a.images[0], a.images[1])                      # two processes, one seed: one state
    assert np.abs(a.images.astype(int) - c.images).mean() > 0.05          # another seed moves the object
    return a.images[0, 0].astype(int)


@pytest.mark.sim
def test_robosuite_fast_render_matches_stock_and_resets_are_seeded():
    """The fast-render frame is the stock frame without anti-aliasing (once, a rebuilt render
    context left every frame garbage: a std check passed, this comparison fails)."""
    pytest.importorskip("robosuite", reason="robosuite not installed (pip install --no-deps robosuite==1.5.2)")
    fast, stock = (seeded_first_frames([f"env.fast_render={f}"], 7) for f in (True, False))
    diff = np.abs(fast - stock)
    assert diff.mean() < 3.0, f"fast-render frame differs from the stock one by {diff.mean():.1f}/255 on average"


@pytest.mark.sim
def test_metaworld_resets_are_seeded():
    """Meta-World's own MT1 wrapper ignores reset seeds (it picks one of 50 fixed positions with
    its own RNG); the adapter seeds the task's RNG instead."""
    pytest.importorskip("metaworld", reason="metaworld not installed (pip install --no-deps metaworld==3.1.1)")
    frame = seeded_first_frames(["env=metaworld_pickplace", "env.task=drawer-open-v3"], 4)
    assert frame.std() > 10   # a rendered scene


@pytest.mark.sim
def test_robosuite_lift_child_process_steps_and_restarts_after_kill():
    pytest.importorskip("robosuite", reason="robosuite not installed (pip install --no-deps robosuite==1.5.2)")
    cfg = compose(["env.num_envs=1", "env.step_timeout=30"])
    g = make_vec_env(cfg, [0], seed=0, auto_reset=True, encode=words(cfg))
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


@pytest.mark.sim
def test_robocasa_action_mapping_on_robosuites_own_mobile_manipulator():
    """RoboCasa cannot be installed here; its adapter's action mapping is checked on robosuite's
    PandaOmron (Omron mobile base + Panda): each policy part lands where the composite controller
    reads it, so closing the gripper closes it and a base command moves the base only."""
    pytest.importorskip("robosuite", reason="robosuite not installed")
    import robosuite

    from rlvla3.envs.base import child_env_vars
    from rlvla3.envs.robocasa_env import ACTION_DIM, action_layout, to_env_action

    child_env_vars()
    env = robosuite.make("Lift", robots="PandaOmron", has_renderer=False, has_offscreen_renderer=False,
                         use_camera_obs=False, ignore_done=True, control_freq=20)
    try:
        layout = action_layout(env.robots[0], env.action_dim)
        assert ACTION_DIM == env.action_dim == 12
        covered = sorted(i for a, b in layout.values() for i in range(a, b))
        assert covered == list(range(12)), layout

        def run(policy_action, steps=15):
            raw = env.reset()
            start = {k: raw[k].copy() for k in ("robot0_gripper_qpos", "robot0_base_pos")}
            for _ in range(steps):
                raw, *_ = env.step(to_env_action(policy_action, layout, env.action_dim))
            return {k: raw[k] - v for k, v in start.items()}

        grip = np.zeros(12)
        grip[6] = 1.0                         # right_gripper: close
        moved = run(grip)
        assert np.abs(moved["robot0_gripper_qpos"]).max() > 0.005 and np.abs(moved["robot0_base_pos"]).max() < 0.01
        drive = np.zeros(12)
        drive[7] = 1.0                        # base: forward
        drive[11] = 1.0                       # base_mode: drive the base
        moved = run(drive)
        assert np.abs(moved["robot0_base_pos"][:2]).max() > 0.02, moved
    finally:
        env.close()


def test_robocasa_missing_says_what_to_install():
    import importlib.util

    from rlvla3.envs.robocasa_env import require_robocasa

    if importlib.util.find_spec("robocasa") is not None:
        pytest.skip("robocasa is installed here: the missing-install message cannot be shown")
    with pytest.raises(RuntimeError, match="RoboCasa is not installed.*download_kitchen_assets"):
        require_robocasa()


@pytest.mark.sim
def test_robosuite_position_only_arm_lifts_with_the_expert_and_keeps_the_hand_orientation():
    """env.arm_controller=OSC_POSITION: a 4-D action (position delta, gripper); the Lift expert's
    action maps onto it and still lifts the cube, and the hand never turns."""
    pytest.importorskip("robosuite", reason="robosuite not installed (pip install --no-deps robosuite==1.5.2)")
    from rlvla3.envs.robosuite_env import RobosuiteEnv

    cfg = compose(["env.arm_controller=OSC_POSITION"])
    assert spec(cfg).action_dim == 4
    env = RobosuiteEnv(cfg.env)
    try:
        obs = env.reset(seed=3)
        quat0 = obs.proprio[3:7].copy()
        for t in range(80):
            action = env.expert_action()
            assert action.shape == (4,)
            obs, _, success, _, _ = env.step(action)
            if success:
                break
        assert success, "the Lift expert did not lift the cube in 80 steps with the position-only arm"
        assert abs(abs(float(quat0 @ obs.proprio[3:7])) - 1) < 1e-3, "the hand turned"
    finally:
        env.close()


def test_position_only_arm_is_refused_where_it_does_not_apply():
    from rlvla3.config import ConfigError
    from rlvla3.world import validate

    with pytest.raises(ConfigError, match="only env.name=robosuite or libero"):
        validate(compose(["env=metaworld_pickplace", "env.arm_controller=OSC_POSITION"]))
    with pytest.raises(ConfigError, match="OSC_POSE or OSC_POSITION"):
        validate(compose(["env.arm_controller=JOINT_VELOCITY"]))


def test_env_children_survive_slurms_preemption_signal_and_a_dead_child_is_restarted():
    """Slurm sends USR2 to every process of the step before the time limit, and TERM at the
    requeue: the env children must live on (the rank checkpoints and requeues on it). A child that dies while its group waits for
    an action is restarted when the group next sends, instead of raising BrokenPipeError."""
    from rlvla3.envs.hosting import ProcessVecEnv

    cfg = compose(["+experiment=toy"])
    g = ProcessVecEnv(cfg, [0], 0, True, words(cfg))
    try:
        reset(g)
        pid = g.procs[0].pid
        os.kill(pid, signal.SIGUSR2)
        os.kill(pid, signal.SIGUSR1)
        os.kill(pid, signal.SIGTERM)          # Slurm's at a requeue (it killed them mid-shutdown)
        time.sleep(1.0)
        assert g.procs[0].is_alive(), f"exit code {g.procs[0].exitcode}"
        drive(g, np.zeros((1, 1, 2), np.float32))
        os.kill(pid, signal.SIGKILL)          # dies while the group waits for its next action
        g.procs[0].join(timeout=10)
        out = drive(g, np.zeros((1, 1, 2), np.float32))
        assert out.errors == 1 and out.truncated[0] and g.procs[0].pid != pid and g.procs[0].is_alive()
    finally:
        g.close()


@pytest.mark.sim
def test_an_env_that_cannot_start_fails_after_bounded_restarts():
    """env.task=NoSuchTask: every child dies at start-up; after env.max_failed_starts restarts the
    group raises, naming the env and the task, instead of restarting forever."""
    from rlvla3.envs.hosting import EnvStartError, ProcessVecEnv

    cfg = compose(["env=robosuite_lift", "env.task=NoSuchTask", "env.max_failed_starts=1"])
    g = ProcessVecEnv(cfg, [0], 0, True, words(cfg))
    t0 = time.monotonic()
    try:
        g.start_reset()
        with pytest.raises(EnvStartError, match=r"env 0: its child process died \(exit code 1\).*2 times.*NoSuchTask"):
            while not g.ready():
                assert time.monotonic() - t0 < 120, "still restarting"
                time.sleep(0.05)
    finally:
        for p in g.procs:
            if p is not None and p.is_alive():
                p.kill()


def test_a_child_still_starting_has_start_timeout_and_a_started_one_reset_timeout():
    """Children start together and take turns on the cores (8 LIBERO children on 2 cores took
    over env.reset_timeout to answer their first reset, were restarted together, and timed out
    again until the job failed). A stopped child stands in for a slow start here."""
    from rlvla3.envs.hosting import ProcessVecEnv

    cfg = compose(["+experiment=toy", "env.reset_timeout=1", "env.start_timeout=30"])
    g = ProcessVecEnv(cfg, [0], 0, True, words(cfg))
    try:
        pid = g.procs[0].pid
        os.kill(pid, signal.SIGSTOP)
        g.start_reset()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:     # past reset_timeout: still starting, not restarted
            assert not g.ready() and g.restarts == [0]
            time.sleep(0.05)
        os.kill(pid, signal.SIGCONT)
        reset_wait(g)
        assert g.restarts == [0] and g.procs[0].pid == pid
        os.kill(pid, signal.SIGSTOP)           # answered once: now a reset has reset_timeout
        t0 = time.monotonic()
        g.start_reset()
        while g.restarts == [0]:
            g.ready()
            assert time.monotonic() - t0 < 5, "a started child that stopped answering was not restarted"
            time.sleep(0.05)
        assert g.procs[0].pid != pid
        reset_wait(g)                          # the new child starts within its start_timeout
    finally:
        g.close()


def test_a_child_lost_during_a_group_reset_restarts_from_that_resets_seed():
    """GRPO resets a group from one shared seed; a child restarted mid-reset used to reset from its
    own seed, so the shard mixed two initial states (and crashed the Trainer on every resume)."""
    from rlvla3.envs.hosting import LocalVecEnv, ProcessVecEnv

    cfg = compose(["+experiment=toy"])
    want = reset(LocalVecEnv(cfg, [0], 0, False, words(cfg)), seed=123)
    g = ProcessVecEnv(cfg, [0], 0, False, words(cfg))
    try:
        g.start_reset(123)
        os.kill(g.procs[0].pid, signal.SIGKILL)       # still starting up: the reset is lost with it
        got = reset_wait(g)
        np.testing.assert_array_equal(got.images, want.images)
        np.testing.assert_array_equal(got.proprio, want.proprio)
    finally:
        g.close()


def reset_wait(vec, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not vec.ready():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return vec.result()


@pytest.mark.sim
@pytest.mark.parametrize("env, drawer", [("robosuite_lift", lambda adapter: adapter.env.sim),
                                         ("metaworld_pickplace", lambda adapter: adapter.env)])
def test_a_chunk_draws_only_its_last_frame_and_it_is_the_frame_every_step_would(env, drawer):
    """The policy sees a chunk's last observation only, so the envs draw no other (rendering is most
    of a rendered step here): a seeded episode stepped as chunks of 4 ends each chunk on the same
    frame and proprio as stepped one observed action at a time, with one draw a chunk instead of 4
    (LIBERO: tests/envs/test_libero.py)."""
    cfg = compose([f"env={env}", "env.num_envs=1", "env.in_process=true"])
    vec = make_vec_env(cfg, [0], 0, auto_reset=False, encode=words(cfg))
    dim = spec(cfg).action_dim
    actions = np.random.default_rng(0).uniform(-1, 1, (3, 4, dim)).astype(np.float32)
    target, draws = drawer(vec.eps[0].env), {}
    render = target.render
    try:
        ends = {}
        for chunked in (False, True):
            start = reset(vec, seed=7)
            draws[chunked] = []
            target.render = lambda *a, _count=draws[chunked], **k: (_count.append(1), render(*a, **k))[1]
            ends[chunked] = [drive(vec, chunk[None]) if chunked else [drive(vec, a[None, None]) for a in chunk][-1]
                             for chunk in actions]
            target.render = render
        assert (len(draws[False]), len(draws[True])) == (12, 3), draws
        for eager, lazy in zip(ends[False], ends[True]):
            assert int(lazy.env_steps[0]) == 4
            np.testing.assert_array_equal(eager.images, lazy.images)
            np.testing.assert_array_equal(eager.proprio, lazy.proprio)
        assert np.abs(lazy.images.astype(int) - start.images.astype(int)).mean() > 0.1   # the arm moved in view
    finally:
        vec.close()


@pytest.mark.sim
@pytest.mark.parametrize("overrides,named,valid", [
    (["env=metaworld_pickplace", "env.task=nosuch-v3"], "env.task='nosuch-v3'", "pick-place-v3"),
    (["env.cameras=[nosuchcam]"], "no camera ['nosuchcam']", "robot0_eye_in_hand"),
    (["env.robot=Pandas"], "env.robot='Pandas'", "'Panda'"),
    (["env=robosuite_lift", "env.task=Liftt"], "env.task='Liftt'", "'Lift'"),
])
def test_an_unknown_task_camera_or_robot_is_refused_in_one_line_before_any_rank_starts(tmp_path, overrides, named, valid):
    # The env's own packages say what they accept (envs/choices.py); nothing is written or started.
    run = tmp_path / "r"
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", *overrides, f"run_dir={run}"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    errors = out.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("config error: ") and named in errors[0] and valid in errors[0], errors
    assert not run.exists() and "mpiexec" not in out.stdout
