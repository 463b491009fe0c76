"""LIBERO with its real assets, under its own interpreter (.venv-libero, scripts/setup_libero.sh):
the adapter's observation and success wiring, and LIBERO rollouts through the engine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from rlvla3.cluster.compose import compose, prepare_run_dir
from rlvla3.config import ConfigError
from rlvla3.envs import SOURCE_ROOT
from rlvla3.envs.hosting import foreign_env
from rlvla3.envs.wire import config_tree
from tests.conftest import needs_mpi

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
                       timeout=timeout, env=foreign_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_success_is_the_goal_zero_actions_are_not_and_a_seed_is_one_initial_state():
    """One LIBERO process (each costs ~20 s to start), libero_object task 0. Success: the alphabet
    soup dropped into the basket from above (privileged state) reaches the task's goal, the same
    episode with the arm still does not. Initial states: one seed is one state (a GRPO group),
    env.init_states=fixed takes the suite's fixed state (which task a seed picks: the protocol
    test and test_sequential_seeds_...)."""
    cfg = compose(["env=libero", "env.suite=libero_object", "env.task_ids=[0]", "env.image_size=64",
                   "env.cameras=[agentview]", "env.init_states=fixed", "env.settle_steps=0"])
    left = lambda: set(Path(tempfile.gettempdir()).glob("libero-config-*"))   # noqa: E731
    before = left()
    got = in_libero(cfg, """
        import os
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
        print(json.dumps({"images": list(obs.images.shape), "proprio": list(obs.proprio.shape),
                          "instruction": obs.instruction, "still": any(still), "dropped": any(dropped),
                          "fixed": bool(np.allclose(fixed[:len(want)], want, atol=1e-6)),
                          "same": bool(np.allclose(a, b)), "differs": not np.allclose(a, c),
                          "config": os.environ["LIBERO_CONFIG_PATH"]}))
    """)
    # LIBERO reads its config folder from one empty folder per user: no folder left per process
    assert Path(got["config"]).name == f"rlvla3-libero-config-{os.getuid()}" and left() <= before, got
    assert got["images"] == [1, 64, 64, 3] and got["proprio"] == [8]
    assert got["instruction"] == "pick up the alphabet soup and place it in the basket"
    assert not got["still"] and got["dropped"], got
    assert got["fixed"] and got["same"] and got["differs"], got


@pytest.mark.parametrize("hard_reset,pipeline", [(True, "direct"), (False, "direct"), (False, "openvla")])
def test_a_chunk_draws_only_its_last_frame_and_it_is_the_frame_every_step_would_draw(hard_reset, pipeline):
    """Rendering is most of a LIBERO step on a CPU, and the policy sees only a chunk's last
    observation: hosting's Episode asks the env to draw only that one (base.LazyCameras), and an
    image pipeline prepares only the frames drawn. The same episode (one fixed state, one action
    sequence) stepped as chunks of 4 and as single observed steps: identical frames of both cameras
    and proprio at every chunk's end, and 2 camera draws per chunk instead of 8; after hard resets
    (robosuite puts its own camera sensors back) and soft."""
    cfg = compose(["env=libero", "env.suite=libero_object", "env.task_ids=[0]", "env.image_size=64",
                   "env.init_states=fixed", "env.settle_steps=2", f"env.hard_reset={hard_reset}",
                   f"env.image_pipeline={pipeline}"])
    got = in_libero(cfg, """
        from rlvla3.envs.hosting import Episode
        ep = Episode(namespace(json.loads(sys.argv[1])), 0, 0, auto_reset=False)
        actions = np.random.default_rng(0).uniform(-1, 1, (4, 4, 7)).astype(np.float32)

        import rlvla3.envs.libero_env as adapter
        prepare, prepared = adapter.prepare, []
        adapter.prepare = lambda *a: (prepared.append(1), prepare(*a))[1]

        def run(chunked):
            first = ep.reset(0)
            sim, draws = ep.env.env.env.sim, []
            render = sim.render
            sim.render = lambda *a, **k: (draws.append(k.get("camera_name")), render(*a, **k))[1]
            prepared.clear()
            ends = []
            for chunk in actions:
                outs = [ep.step(chunk)] if chunked else [ep.step(a[None]) for a in chunk]
                ends.append((outs[-1].obs.images, outs[-1].obs.proprio))
            return first, ends, len(draws), len(prepared)

        (first_a, eager, eager_draws, _), (first_b, lazy, lazy_draws, lazy_prepared) = run(False), run(True)
        print(json.dumps({"shape": list(lazy[0][0].shape), "eager_draws": eager_draws, "lazy_draws": lazy_draws,
                          "lazy_prepared": lazy_prepared,
                          "first": bool(np.array_equal(first_a.images, first_b.images)),
                          "frames": [bool(np.array_equal(a[0], b[0])) for a, b in zip(eager, lazy)],
                          "proprio": [bool(np.array_equal(a[1], b[1])) for a, b in zip(eager, lazy)],
                          "moved": bool(np.abs(lazy[-1][0].astype(int) - first_b.images.astype(int)).mean() > 0.5)}))
    """)
    assert got["shape"] == [2, 64, 64, 3], got
    assert got["eager_draws"] == 16 * 2 and got["lazy_draws"] == 4 * 2, got
    assert got["lazy_prepared"] == got["lazy_draws"], got   # only drawn frames go through the pipeline
    assert got["first"] and all(got["frames"]) and all(got["proprio"]), got
    assert got["moved"], got   # the frames compared are not one still picture


@pytest.mark.parametrize("init_states", ["fixed", "sampled"])
def test_a_soft_reset_episode_is_the_hard_reset_episode_of_its_seed(init_states):
    """A soft reset (the same model, robosuite's reset) used to carry the gripper's last command
    and the solver's warm start into the next episode, so an episode depended on the one before
    it (a GRPO group's episodes drifted apart), and a process's first episode drew the robot's
    collision meshes (fast render's new context lacked robosuite's geom groups). Now: seed 0's
    episode after another episode, by soft resets, is bitwise the same as by hard resets and as
    seed 0's first soft episode (the first observation's frame, every joint at every step)."""
    cfg = compose(["env=libero", "env.suite=libero_object", "env.task_ids=[0]", "env.image_size=64",
                   "env.cameras=[agentview]", f"env.init_states={init_states}", "env.settle_steps=2",
                   "env.hard_reset=false"])
    got = in_libero(cfg, """
        actions = np.random.default_rng(0).uniform(-1, 1, (8, 7)).astype(np.float32)
        other = np.random.default_rng(1).uniform(-1, 1, (20, 7)).astype(np.float32)

        def episode(env, seed, acts):
            first = env.reset(seed).images
            joints = []
            for a in acts:
                env.step(a)
                joints.append(np.array(env.env.env.sim.data.qpos))
            return first, np.array(joints)

        first_a, a = episode(env, 0, actions)
        episode(env, 3, other)
        first_b, b = episode(env, 0, actions)
        settings = json.loads(sys.argv[1])
        settings["env"]["hard_reset"] = True
        hard = LiberoEnv(namespace(settings).env)
        episode(hard, 3, other)
        first_h, h = episode(hard, 0, actions)
        print(json.dumps({"soft_again": bool(np.array_equal(a, b)), "soft_vs_hard": bool(np.array_equal(b, h)),
                          "frames_soft": bool(np.array_equal(first_a, first_b)), "frames_hard": bool(np.array_equal(first_b, first_h)),
                          "moved": float(np.abs(b[-1] - b[0]).max()), "drift_before": float(np.abs(a - b).max())}))
    """)
    assert got["soft_again"] and got["soft_vs_hard"] and got["frames_soft"] and got["frames_hard"], got
    assert got["moved"] > 1e-3, got   # the joints compared are not a still arm


def test_bad_libero_settings_are_refused_before_any_rank_starts(tmp_path):
    for override, field in [("env.suite=libero_100", "env.suite"), ("env.task_ids=[10]", "env.task_ids"),
                            ("env.task_ids=[]", "env.task_ids"), ("env.cameras=[frontview]", "env.cameras"),
                            ("env.python=", "env.python"), ("env.init_states=random", "env.init_states")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            prepare_run_dir(compose(["env=libero", override]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_libero_pro_suites_keep_the_tasks_and_change_what_they_name(tmp_path):
    """LIBERO-PRO's suites hold the standard suite's ten tasks in its order (so task ids, step
    limits and held-out states carry over); a paraphrase or a new task reaches the prompt from the
    suite's BDDL file, a changed scene leaves the standard instruction; the object perturbation's
    new assets load and take its fixed state; a suite whose files the installed package lacks is
    refused before any rank starts, naming the file."""
    code = ("import json; from rlvla3.envs.libero_env import facts; "
            "print(json.dumps({s: facts(s) for s in ('libero_object', 'libero_object_lan', 'libero_object_swap', "
            "'libero_object_object', 'libero_object_task')}))")
    p = subprocess.run([str(VENV_PYTHON), "-c", code], capture_output=True, text=True, timeout=300, env=foreign_env(),
                       cwd=SOURCE_ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    f = json.loads(p.stdout.strip().splitlines()[-1])
    standard = f["libero_object"]
    for suite in ("libero_object_lan", "libero_object_swap", "libero_object_object", "libero_object_task"):
        assert f[suite]["task_names"] == standard["task_names"], suite
    assert f["libero_object_swap"]["tasks"] == f["libero_object_object"]["tasks"] == standard["tasks"]
    lan, task = f["libero_object_lan"]["tasks"], f["libero_object_task"]["tasks"]
    assert all(a != b for a, b in zip(lan, standard["tasks"])) and lan[0] == "grab alphabet soup and put it into basket"
    assert task[0] == "pick the cream cheese and place it in the basket" != standard["tasks"][0]
    assert f["libero_object_task"]["goals"][0] != standard["goals"][0]   # another object into the basket
    # The object perturbation's scene from its own fixed state: its new assets load and are placed.
    cfg = compose(["env=libero", "env.suite=libero_object_object", "env.task_ids=[0]", "env.image_size=64",
                   "env.cameras=[agentview]", "env.init_states=fixed", "env.settle_steps=0"])
    got = in_libero(cfg, """
        obs = env.reset(0)
        same = bool(np.allclose(env.env.env.sim.get_state().flatten(), env.suite.get_task_init_states(0)[0]))
        print(json.dumps({"instruction": env.instruction, "objects": sorted(env.env.env.objects_dict), "fixed": same,
                          "image": list(obs.images.shape)}))
    """)
    assert got["fixed"] and got["instruction"] == standard["tasks"][0] and got["image"][-3:] == [64, 64, 3], got
    assert {"bigger_alphabet_soup_1", "red_basket_1"} <= set(got["objects"]), got["objects"]
    with pytest.raises(ConfigError, match=r"libero_object_env: task 0's BDDL file .*libero_object_env/.*\.bddl is not in"):
        prepare_run_dir(compose(["env=libero", "env.suite=libero_object_env"]), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"env\.suite.*LIBERO-PRO perturbation"):
        prepare_run_dir(compose(["env=libero", "env.suite=libero_object_shuffled"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_image_pipeline_renders_at_its_size_and_prepares_each_camera(tmp_path):
    """env.image_pipeline=openvla renders LIBERO at 256 and hands the policy each camera as
    OpenVLA's evaluation prepares it (envs/images.py, checked on its own in test_images.py);
    a pipeline outside LIBERO, a second crop or a size above 256 is refused before any rank starts."""
    cfg = compose(["env=libero", "env.suite=libero_object", "env.task_ids=[0]", "env.image_size=224",
                   "env.cameras=[agentview,robot0_eye_in_hand]", "env.image_pipeline=openvla", "env.init_states=fixed"])
    got = in_libero(cfg, """
        from rlvla3.envs.images import prepare
        obs = env.reset(0)
        raw = [env.raw[f"{cam}_image"] for cam in env.c.cameras]
        want = [prepare(r[::-1, ::-1], "openvla", 224) for r in raw]
        print(json.dumps({"raw": [list(r.shape) for r in raw], "obs": list(obs.images.shape),
                          "same": [bool(np.array_equal(o, w)) for o, w in zip(obs.images, want)]}))
    """)
    assert got["raw"] == [[256, 256, 3]] * 2 and got["obs"] == [2, 224, 224, 3] and all(got["same"]), got
    for over, field in [(["env=toy", "env.image_pipeline=openvla"], "env.image_pipeline"),
                        (["env=libero", "env.image_pipeline=openvla", "env.image_size=224", "policy.image_crop=0.9"],
                         "policy.image_crop"),
                        (["env=libero", "env.image_pipeline=openpi", "env.image_size=320"], "env.image_size")]:
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            prepare_run_dir(compose(over), tmp_path / "run")


def tiny_checkpoint(path, overrides):
    import torch

    from rlvla3.policies import make_policy
    from rlvla3.world import spec

    cfg = compose(overrides)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": make_policy(cfg, spec(cfg)).state_dict()}, path)
    return path


TINY = ["env.image_size=64", "env.cameras=[agentview]", "policy=tiny", "policy.patch=16"]


@needs_mpi
@pytest.mark.slow
def test_the_protocol_runs_each_task_and_state_once_through_the_engine(tmp_path):
    """`evaluate --protocol libero --generalization` on libero_spatial tasks 0 and 1 x 2 fixed
    states (a step limit of 6, not the suite's 220: CI time): Simulator
    ranks host LIBERO under .venv-libero's interpreter, the tiny VLA acts, each (task, state) runs
    once, the report has Wilson intervals and the simulator versions; the shards hold LIBERO's
    images, proprio and 7-D actions. The one table names the scene swap the installed package
    lacks files for as not run."""
    import numpy as np

    from rlvla3.engine import shards

    ckpt = tiny_checkpoint(tmp_path / "init.pt", ["env=libero", *TINY])
    out = subprocess.run([sys.executable, "-m", "rlvla3.evaluate", "--protocol", "libero", "--generalization",
                          "--perturbations", "env", "--checkpoint", str(ckpt),
                          "--states", "2", "--max-steps", "6", "--out", str(tmp_path / "eval"), "env.task_ids=[0,1]",
                          "env.num_envs=2", "env.settle_steps=2", *TINY, "runtime.tensorboard=false"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = tmp_path / "eval" / "libero_spatial"
    result = json.loads((run / "protocol.json").read_text())
    assert {t: r["episodes"] for t, r in result["tasks"].items()} == {"0": 2, "1": 2}
    assert result["suite"]["episodes"] == 4 and result["max_steps"] == 6 and not result["standard_step_limit"]
    lo, hi = result["suite"]["wilson95"]
    assert lo <= result["suite"]["success_rate"] <= hi and hi > 0
    assert result["versions"]["robosuite"] == "1.4.0" and result["versions"]["mujoco"].startswith("2.3.")
    assert result["tasks"]["0"]["instruction"].startswith("pick up the black bowl") and result["perturbation"] is None
    assert (run / "protocol.png").stat().st_size > 0
    assert "(NOT the suite limit)" in out.stdout
    split = json.loads((run / "init_states.json").read_text())
    assert split["purpose"] == "evaluation" and split["uses"]["kind"] == "fixed"
    names = [n for n in shards.scan(run / "shards") if shards.parse_name(n)[0] < 2]
    seeds = sorted(s for n in names for s in shards.read_attrs(run / "shards" / n)["reset_seeds"])
    assert seeds == [0, 1, 2, 3]
    arrays, attrs = shards.read_shard(run / "shards" / names[0])
    assert arrays["images"].shape[2:] == (1, 64, 64, 3) and arrays["proprio"].shape[-1] == 8
    assert arrays["actions"].shape[-1] == 7 and attrs["env"] == "libero"
    assert np.ptp(arrays["proprio"][:, :, :3]) > 0   # the arm moved
    videos = sorted(p.name for p in (run / "videos").glob("*.mp4"))   # --videos 2 per task (default)
    assert len(videos) == 4 and all(v.startswith(("task0-pick-up-the-black-bowl", "task1-pick-up-the-black-bowl"))
                                    for v in videos), videos
    # LIBERO-PRO: the table holds the standard suite's row and names the scene swap the installed
    # package lacks files for as not run (a perturbation suite's own run: docs/results/libero.md).
    rows = {r["suite"]: r for r in json.loads((tmp_path / "eval" / "generalization.json").read_text())["suites"]}
    assert list(rows) == ["libero_spatial", "libero_spatial_env"]
    assert rows["libero_spatial"]["episodes"] == 4 and rows["libero_spatial"]["successes"] == result["suite"]["successes"]
    assert "BDDL file" in rows["libero_spatial_env"]["not_run"] and "scene" in rows["libero_spatial_env"]["changes"]
    assert "LIBERO-PRO generalization" in out.stdout and "not run" in out.stdout


def test_the_protocol_refuses_a_checkpoint_trained_on_its_test_states(tmp_path):
    """A training run on the fixed states records it (init_states.json); the protocol names that
    record and refuses before any rank starts. A run on sampled states records it held them out."""
    train = tmp_path / "train"
    prepare_run_dir(compose(["env=libero", "env.init_states=fixed"]), train)
    split = json.loads((train / "init_states.json").read_text())
    assert split["purpose"] == "training" and split["uses_test_states"]
    ckpt = tiny_checkpoint(train / "ckpt" / "v000001.pt", ["env=libero", *TINY])
    out = subprocess.run([sys.executable, "-m", "rlvla3.evaluate", "--protocol", "libero", "--checkpoint", str(ckpt),
                          "--out", str(tmp_path / "eval"), *TINY], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "trained on libero_spatial's fixed initial states" in out.stderr, out.stderr[-2000:]
    assert "init_states.json" in out.stderr and not (tmp_path / "eval").exists()
    prepare_run_dir(compose(["env=libero"]), tmp_path / "held-out")
    assert not json.loads((tmp_path / "held-out" / "init_states.json").read_text())["uses_test_states"]
    # An SFT checkpoint carries its demonstrations' record beside it (sft.keep_state_record).
    from rlvla3.tools.libero_protocol import refuse_trained_on_test_states
    from rlvla3.tools.sft import keep_state_record

    sft = tiny_checkpoint(tmp_path / "recipe" / "sft.pt", ["env=libero", *TINY])
    keep_state_record(train, sft)
    assert (tmp_path / "recipe" / "sft.init_states.json").is_file()
    with pytest.raises(SystemExit, match="sft.init_states.json"):
        refuse_trained_on_test_states(sft, "libero_spatial", allow=False)
    assert refuse_trained_on_test_states(sft, "libero_object", allow=False) == "", "another suite's states"
    # RL from that SFT checkpoint on sampled states keeps the record of what its start saw.
    rl = tmp_path / "rl"
    prepare_run_dir(compose(["env=libero", f"policy.init_from={sft}"]), rl)
    assert json.loads((rl / "init_states.json").read_text())["init_from"]["checkpoint"] == str(sft)
    with pytest.raises(SystemExit, match="the checkpoint it started from"):
        refuse_trained_on_test_states(tiny_checkpoint(rl / "ckpt" / "v000001.pt", ["env=libero", *TINY]),
                                      "libero_spatial", allow=False)


def test_sequential_seeds_visit_every_task_and_fixed_state_once():
    """The protocol's 2 envs x 3 rounds = seeds 0..5 = tasks [3, 7] x fixed states 0..2, each once."""
    from rlvla3.envs.hosting import episode_seed
    from rlvla3.envs.libero_env import episode_of

    seeds = [episode_seed(0, env, k, num_envs=2, order="sequential") for k in range(3) for env in range(2)]
    assert sorted(seeds) == list(range(6))
    assert sorted(episode_of(s, [3, 7]) for s in seeds) == [(t, i) for t in (3, 7) for i in range(3)]
    assert len({episode_seed(0, env, k, 2) for k in range(3) for env in range(2)}) == 6   # hashed: distinct too


def test_repeated_protocol_episodes_wrap_onto_the_fixed_states_and_are_all_counted():
    """--repeats R: seeds 0..tasks*50*R-1 visit every (task, fixed state) R times; the table counts
    every episode and a missing one still fails. Repeats need all 50 states and sampled actions;
    the recipe turns more than 50 episodes a task into repeats."""
    import argparse

    from rlvla3.envs.libero_env import FIXED_STATES, episode_of
    from rlvla3.tools import evaluate
    from rlvla3.tools.libero_protocol import check_repeats, tabulate
    from rlvla3.tools.recipe import eval_args

    tasks, repeats = [3, 7], 3
    seeds = range(len(tasks) * FIXED_STATES * repeats)
    visits = {}
    for s in seeds:
        visits[episode_of(s, tasks)] = visits.get(episode_of(s, tasks), 0) + 1
    assert visits == {(t, i): repeats for t in tasks for i in range(FIXED_STATES)}
    episodes = {s: (s % 4 == 0, 10) for s in seeds}
    table = tabulate(episodes, tasks, FIXED_STATES * repeats)
    assert {t: r["episodes"] for t, r in table["tasks"].items()} == {3: 150, 7: 150}
    assert table["suite"]["successes"] == sum(s % 4 == 0 for s in seeds) and table["suite"]["episodes"] == 300
    del episodes[299]
    with pytest.raises(RuntimeError, match="1 of 300 episodes never ran"):
        tabulate(episodes, tasks, FIXED_STATES * repeats)
    check_repeats(1, 20, greedy=True)   # one visit: any states, greedy or not
    with pytest.raises(SystemExit, match="use --states 50"):
        check_repeats(2, 20, greedy=False)
    with pytest.raises(SystemExit, match="greedy"):
        check_repeats(2, FIXED_STATES, greedy=True)
    with pytest.raises(SystemExit, match="--repeats=0"):
        check_repeats(0, FIXED_STATES, greedy=False)
    with pytest.raises(SystemExit, match="only --protocol libero"):
        evaluate.main(["--checkpoint", "x.pt", "--repeats", "2"])
    cfg = compose(["env=libero", "env.task_ids=[0]"])
    for n, want in ((150, ["--states", "50", "--repeats", "3"]), (20, ["--states", "20", "--repeats", "1"])):
        args, result, count = eval_args(argparse.Namespace(eval_episodes=n), cfg)
        assert args[2:6] == want and result == "protocol.json" and count == n
    with pytest.raises(SystemExit, match="multiple of 50"):
        eval_args(argparse.Namespace(eval_episodes=120), cfg)


def test_bench_sims_names_its_libero_rows_and_refuses_unknown_ones():
    from rlvla3.benchmarks.sims import LIBERO_TASKS, sim_task_names

    assert sim_task_names("Lift,libero") == ["Lift", *LIBERO_TASKS]
    assert {"libero_spatial@stock", "libero_spatial@1cam", "libero_spatial@224", "libero_90"} <= set(LIBERO_TASKS)
    with pytest.raises(SystemExit, match="unknown \\['libero_100'\\]"):
        sim_task_names("libero_100")


def test_fidelity_moves_a_state_between_joint_layouts_by_name():
    """robosuite 1.5 renames the gripper joints and may order joints differently: a state is moved
    joint by joint (qpos and qvel), by name; a joint the other layout lacks stays 0."""
    import numpy as np

    from rlvla3.tools.libero_fidelity import make_actions, quat_angle_deg, remap_state

    src = [["robot0_joint1", 0, 1, 0, 1], ["gripper0_finger_joint1", 1, 1, 1, 1], ["obj_joint0", 2, 7, 2, 6]]
    dst = [["obj_joint0", 0, 7, 0, 6], ["robot0_joint1", 7, 1, 6, 1], ["extra", 8, 1, 7, 1]]
    state = np.arange(1 + 9 + 8, dtype=float)   # time, qpos 9, qvel 8
    out = remap_state(state, src, dst, dst_nq=9, dst_nv=8)
    assert out[0] == 0 and list(out[1:8]) == list(state[3:10]) and out[8] == state[1] and out[9] == 0
    assert list(out[10:16]) == list(state[12:18]) and out[16] == state[10] and out[17] == 0
    a = make_actions(200, seed=0)
    assert a.shape == (200, 7) and np.abs(a).max() <= 1 and set(np.unique(a[:, 6])) == {-1.0, 1.0}
    assert np.array_equal(a, make_actions(200, seed=0))
    assert abs(quat_angle_deg([1, 0, 0, 0], [np.cos(0.05), np.sin(0.05), 0, 0]) - np.degrees(0.1)) < 1e-9


@needs_mpi
@pytest.mark.slow
def test_the_expert_demonstrates_libero_object_through_collect(tmp_path):
    """`python -m rlvla3.collect env=libero`: the BDDL-driven expert (libero_experts.py) puts the
    cream cheese (flat, 1.8 cm, beside tall boxes: the hardest of libero_object) in the basket from
    two sampled placements (held out from the protocol's fixed states), through real mpiexec and
    LIBERO env processes; the rows hold the policy's input only (images, proprio 8, instruction)
    and the LeRobotDataset export has whole episodes."""

    from rlvla3.engine import shards

    out = subprocess.run([sys.executable, "-m", "rlvla3.collect", "--out", str(tmp_path / "demos"), "--episodes", "2",
                          "--format", "lerobot", "env=libero", "env.suite=libero_object", "env.task_ids=[1]",
                          "env.num_envs=2", "env.image_size=64", "env.cameras=[agentview]", "algo.segment_steps=64"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = [shards.read_shard(tmp_path / "demos" / "shards" / n) for n in shards.scan(tmp_path / "demos" / "shards")]
    ends = sum(attrs["episode_ends"] for _, attrs in got)
    assert ends >= 2 and sum(attrs["successes"] for _, attrs in got) == ends, out.stdout[-2000:]
    a, attrs = got[0]
    assert a["proprio"].shape[-1] == 8 and a["actions"].shape[-1] == 7 and a["images"].shape[2:] == (1, 64, 64, 3)
    assert a["images"].std() > 0 and attrs["source"] == "expert"
    assert attrs["instructions"][0] == [[0, "pick up the cream cheese and place it in the basket"]]   # env 0's texts
    grip = a["actions"][..., 6]
    assert (grip > 0).any() and (grip < 0).any(), "the gripper opens and closes"
    assert (tmp_path / "demos" / "lerobot" / "meta" / "info.json").is_file()
    split = json.loads((tmp_path / "demos" / "init_states.json").read_text())
    assert split["uses"]["kind"] == "sampled" and not split["uses_test_states"]


def test_the_expert_puts_a_libero_spatial_bowl_on_the_plate_from_a_fixed_state():
    """The same expert on the other suite's shape: a bowl pinched at its rim (`On bowl plate`),
    from libero_spatial task 0's fixed state 0, within the suite's step limit."""
    cfg = compose(["env=libero", "env.task_ids=[0]", "env.image_size=64", "env.cameras=[agentview]",
                   "env.init_states=fixed"])
    got = in_libero(cfg, """
        env.reset(0)
        for t in range(220):
            done = env.step(env.expert_action())[2]
            if done:
                break
        print(json.dumps({"done": bool(done), "steps": t + 1, "goal": env.expert.relation}))
    """)
    assert got["done"] and got["goal"] == "on", got


def test_position_control_takes_4d_actions_holds_the_hand_and_the_expert_still_succeeds():
    """env.arm_controller=OSC_POSITION on LIBERO: robosuite 1.4's own position controller, 4-D
    actions (position 3 + gripper) from the env's dims to the expert's; the hand keeps the
    orientation it starts with through a whole expert episode (libero_object task 0, fixed state 0)."""
    from rlvla3.envs import env_dims

    cfg = compose(["env=libero", "env.suite=libero_object", "env.task_ids=[0]", "env.image_size=64",
                   "env.cameras=[agentview]", "env.init_states=fixed", "env.arm_controller=OSC_POSITION"])
    assert env_dims(cfg).action_dim == 4
    got = in_libero(cfg, """
        env.reset(0)
        q0 = env.raw["robot0_eef_quat"].copy()
        sizes, turn = set(), 0.0
        for t in range(280):
            a = env.expert_action()
            sizes.add(a.shape[0])
            done = env.step(a)[2]
            turn = max(turn, 2 * np.degrees(np.arccos(min(1.0, abs(float(q0 @ env.raw["robot0_eef_quat"]))))))
            if done:
                break
        print(json.dumps({"done": bool(done), "steps": t + 1, "sizes": sorted(sizes), "turn_deg": turn,
                          "controller": type(env.env.env.robots[0].controller).__name__,
                          "control_dim": int(env.env.env.robots[0].controller.control_dim)}))
    """)
    assert got["done"] and got["sizes"] == [4] and got["control_dim"] == 3, got
    assert got["turn_deg"] < 2.0, got   # OSC_POSE with the tiny VLA's zero-rotation bin drifts ~7 degrees an episode


def test_collect_refuses_a_libero_task_the_expert_cannot_do(tmp_path):
    """libero_goal task 0 opens a drawer (not pick-and-place): refused before any rank starts,
    naming the tasks of the suite that do have an expert."""
    out = subprocess.run([sys.executable, "-m", "rlvla3.collect", "--out", str(tmp_path / "d"), "env=libero",
                          "env.suite=libero_goal", "env.task_ids=[0]"], capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "tasks [0] have no scripted expert" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "d").exists()
