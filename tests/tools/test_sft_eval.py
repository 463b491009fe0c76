"""The warm-start recipe's tools on toy: expert demonstrations -> SFT -> evaluation over the real
engine (whole episodes from held-out seeds, Wilson interval)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from rlvla3.tools.episodes import wilson
from tests.conftest import needs_mpi


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def check_videos(run_dir, n: int) -> None:
    """--videos n on the single-task toy: the first n episodes by seed as H.264 mp4, each frame
    what the policy saw, the outcome in the name; logged to TensorBoard and the offline W&B run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlvla3.tools.episodes import whole_episodes
    from rlvla3.tools.videos import episodes_with_frames, read_mp4

    episodes = sorted(episodes_with_frames(run_dir, 4))[:n]
    outcome = {seed: s for seed, s, _ in whole_episodes(run_dir, 4)}
    files = sorted((run_dir / "videos").glob("*.mp4"))
    assert [f.name for f in files] == sorted(f"toy-seed{seed}-{'success' if outcome[seed] else 'fail'}.mp4"
                                             for seed, _, _ in episodes)
    for f in files:
        seed = int(f.name.split("-seed")[1].split("-")[0])
        frames = next(fr for s, _, fr in episodes if s == seed)
        video = read_mp4(f)[1][:, :21, :21].astype(int)       # H.264 wants even sides: padded to 22
        assert video.shape == frames.shape and abs(video - frames).mean() < 12   # lossy, but the same pictures
    tags = []
    for ev in (run_dir / "tb").glob("events*"):
        acc = EventAccumulator(str(ev), size_guidance={"images": 0})
        acc.Reload()
        tags += acc.Tags()["images"]
    assert sorted(tags) == sorted(f"videos/{f.stem}" for f in files)
    assert len(list((run_dir / "wandb").glob("offline-run-*/files/media/videos/videos/*.mp4"))) == n


def check_rollouts_as_lerobot(folder, result: dict) -> None:
    """evaluate --lerobot: the evaluation's episodes, every one and no more, with their outcomes."""
    import pyarrow.parquet as pq

    info = json.loads((folder / "meta" / "info.json").read_text())
    frames = pq.read_table(folder / "data" / "chunk-000" / "file-000.parquet")
    succeeded = set(frames.filter(frames.column("next.success")).column("episode_index").to_pylist())
    assert info["total_episodes"] == result["episodes"] and len(succeeded) == result["successes"], (info, result)
    assert info["total_frames"] == frames.num_rows and frames.column("next.done").to_pylist().count(True) == result["episodes"]


def test_wilson_interval_matches_known_values():
    lo, hi = wilson(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3
    lo, hi = wilson(0, 20)
    assert lo == 0.0 and abs(hi - 0.1611) < 1e-3


@needs_mpi
@pytest.mark.slow
def test_sft_from_demonstrations_beats_chance_in_evaluation(tmp_path):
    run("rlvla3.collect", "+experiment=toy", "--episodes", "100", "--out", str(tmp_path / "demos"))
    out = run("rlvla3.sft", "--demos", str(tmp_path / "demos"), "+experiment=toy", "--steps", "150",
              "--out", str(tmp_path / "sft.pt"))
    assert "loss" in out.stdout
    run("rlvla3.evaluate", "--checkpoint", str(tmp_path / "sft.pt"), "--episodes", "64", "--out", str(tmp_path / "eval"),
        "--videos", "3", "--lerobot", "+experiment=toy", "runtime.wandb=true", "runtime.wandb_mode=offline")
    r = json.loads((tmp_path / "eval" / "eval.json").read_text())
    check_videos(tmp_path / "eval", 3)
    check_rollouts_as_lerobot(tmp_path / "eval" / "lerobot", r)
    print(r)
    assert r["episodes"] == 64, "whole rounds of env.num_envs=16 episodes"
    # A uniform-random policy succeeds ~23% of the time on toy (tests/engine/test_learning.py).
    assert r["wilson95"][0] > 0.23, r
    run("rlvla3.evaluate", "--checkpoint", str(tmp_path / "sft.pt"), "--episodes", "16", "--out", str(tmp_path / "greedy"),
        "--videos", "0", "--greedy", "+experiment=toy", "runtime.tensorboard=false")
    assert json.loads((tmp_path / "greedy" / "eval.json").read_text())["greedy"]
    check_greedy_actions(tmp_path / "greedy", tmp_path / "sft.pt")
    # What it acts on: toy's target is only in the image (egocentric) and the instruction; another
    # row's image must raise the cloned policy's open-loop error well above its own rows'.
    out = run("rlvla3.openloop", "--checkpoint", str(tmp_path / "sft.pt"), "--demos", str(tmp_path / "demos"),
              "--rows", "256", "+experiment=toy")
    mean = {line[:18].strip(): float(line.split()[-1]) for line in out.stdout.splitlines()[2:]}
    assert set(mean) == {"own rows", "images of others", "state of others"}, out.stdout
    assert mean["images of others"] > 5 * mean["own rows"], out.stdout   # measured: 0.82-0.86 vs 0.03-0.05
    missing = subprocess.run([sys.executable, "-m", "rlvla3.openloop", "--checkpoint", str(tmp_path / "none.pt"),
                              "--demos", str(tmp_path / "demos"), "+experiment=toy"], capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and f"--checkpoint {tmp_path / 'none.pt'}: no such checkpoint" in missing.stderr


def check_greedy_actions(run_dir, ckpt) -> None:
    """Every action an evaluate --greedy run took is the policy's argmax for its observation."""
    import torch

    from rlvla3 import config
    from rlvla3.engine import shards
    from rlvla3.engine.torch_learner import load_init
    from rlvla3.policies import make_policy
    from rlvla3.policies.sampling import greedy_noise
    from rlvla3.world import spec

    cfg = config.load(run_dir)
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    load_init(policy, str(ckpt))
    names = shards.scan(run_dir / "shards")
    assert names
    for n in names:
        a, _ = shards.read_shard(run_dir / "shards" / n)
        ok = a["valid"].reshape(-1)
        obs = [torch.from_numpy(a[k].reshape(-1, *a[k].shape[2:])[ok]) for k in ("images", "proprio", "tokens")]
        noise = greedy_noise(sp.sample, np.zeros((int(ok.sum()), *sp.sample.noise_shape), np.float32))
        with torch.no_grad():
            want = policy.act(*obs, torch.from_numpy(noise))[0].numpy()
        np.testing.assert_array_equal(a["sample"].reshape(-1, *sp.sample.shape)[ok], want, err_msg=n)


def test_init_from_refuses_a_checkpoint_of_another_policy(tmp_path):
    import torch

    from rlvla3.cluster.compose import compose
    from rlvla3.engine.torch_learner import load_init
    from rlvla3.policies import make_policy
    from rlvla3.world import spec

    cfg = compose(["+experiment=toy"])
    torch.save({"model": make_policy(cfg, spec(cfg)).state_dict()}, tmp_path / "ok.pt")
    load_init(make_policy(cfg, spec(cfg)), str(tmp_path / "ok.pt"))
    other = compose(["+experiment=toy", "policy.d_model=32"])
    with pytest.raises(RuntimeError, match=r"policy.init_from=.*ok.pt does not fit this policy"):
        load_init(make_policy(other, spec(other)), str(tmp_path / "ok.pt"))
    with pytest.raises(FileNotFoundError, match="no such checkpoint"):
        load_init(make_policy(cfg, spec(cfg)), str(tmp_path / "missing.pt"))


def test_chunks_are_consecutive_actions_padded_at_episode_ends():
    import numpy as np

    from rlvla3.tools.sft import chunk_actions

    a = np.arange(6, dtype=np.float32)[:, None, None] + np.array([0.0, 10.0], np.float32)[None, :, None]
    ended = np.zeros((6, 2), bool)
    ended[2, 0] = True                      # env 0's episode ends at row 2; env 1 runs past the segment
    c = chunk_actions(a, ended, 3)[..., 0]
    assert c[:, 0].tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 5], [4, 5, 5], [5, 5, 5]]
    assert c[:, 1].tolist() == [[10, 11, 12], [11, 12, 13], [12, 13, 14], [13, 14, 15], [14, 15, 15], [15, 15, 15]]


def test_random_shift_moves_each_image_by_its_own_offset_repeating_the_edges():
    import numpy as np
    import torch

    from rlvla3.tools.sft import random_shift

    x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (16, 2, 8, 8, 3), dtype=np.uint8))
    gen = torch.Generator().manual_seed(1)
    assert random_shift(x, 0, gen) is x
    y = random_shift(x, 2, gen)
    offsets = []
    for b in range(16):
        for cam in range(2):
            moved = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                     if torch.equal(y[b, cam], x[b, cam][np.clip(np.arange(8) + dy, 0, 7)][:, np.clip(np.arange(8) + dx, 0, 7)])]
            assert len(moved) == 1, (b, cam)
            offsets.append(moved[0])
    assert len(set(offsets)) > 10                              # 32 images, 25 offsets: not one shared shift
    assert any(a != b for a, b in zip(offsets[::2], offsets[1::2]))   # a row's cameras move independently


@needs_mpi
@pytest.mark.slow
def test_chunked_sft_from_one_step_demonstrations(tmp_path):
    import torch

    from rlvla3.cluster.compose import compose
    from rlvla3.engine.torch_learner import load_init
    from rlvla3.policies import make_policy
    from rlvla3.world import spec

    run("rlvla3.collect", "+experiment=toy", "--episodes", "16", "--out", str(tmp_path / "demos"))
    out = run("rlvla3.sft", "--demos", str(tmp_path / "demos"), "+experiment=toy", "policy.chunk=2", "--steps", "60",
              "--shift", "1", "--out", str(tmp_path / "sft2.pt"))
    record = torch.load(tmp_path / "sft2.pt", weights_only=True)["sft"]
    hist = record["loss"]
    assert sum(hist[-10:]) < sum(hist[:10]) and record["shift"] == 1, out.stdout
    bad = subprocess.run([sys.executable, "-m", "rlvla3.sft", "--demos", str(tmp_path / "demos"), "+experiment=toy",
                          "--shift", "11", "--out", str(tmp_path / "bad.pt")], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--shift 11" in bad.stderr and not (tmp_path / "bad.pt").exists()
    cfg = compose(["+experiment=toy", "policy.chunk=2"])
    load_init(make_policy(cfg, spec(cfg)), str(tmp_path / "sft2.pt"))   # an RL run with chunk 2 starts from it


def test_what_sft_never_trained_is_set_by_the_rl_runs_config(tmp_path):
    """pi05's flow noise std (and the value head) get no gradient from the flow-matching loss: the
    SFT checkpoint names them, and a run starting from it explores with its own policy.flow_noise_std
    while every trained weight is the checkpoint's."""
    import math

    import torch

    from rlvla3.cluster.compose import compose
    from rlvla3.engine.torch_learner import load_init
    from rlvla3.policies import make_policy
    from rlvla3.world import spec

    pi05 = ["+experiment=toy", "policy=pi05", "policy.patch=3", "policy.chunk=2", "policy.denoise_steps=3"]
    run("rlvla3.collect", "+experiment=toy", "--episodes", "16", "--out", str(tmp_path / "demos"))
    run("rlvla3.sft", "--demos", str(tmp_path / "demos"), *pi05, "--steps", "5", "--out", str(tmp_path / "sft.pt"))
    ckpt = torch.load(tmp_path / "sft.pt", weights_only=True)
    untrained = set(ckpt["sft"]["untrained"])
    # Also untrained: what only feeds the value head (the VLM's last queries, MLP and final norm:
    # the expert reads the prefix's keys and values alone).
    assert {"log_std", "value_head.weight", "value_head.bias"} <= untrained
    assert "model.action_in_proj.weight" not in untrained and len(untrained) < len(ckpt["model"]) // 4, untrained
    cfg = compose([*pi05, "policy.flow_noise_std=0.05"])
    policy = make_policy(cfg, spec(cfg))
    load_init(policy, str(tmp_path / "sft.pt"))
    assert torch.allclose(policy.log_std, torch.full_like(policy.log_std, math.log(0.05)))
    assert float(ckpt["model"]["log_std"][0]) == pytest.approx(math.log(0.2))   # SFT's default, not taken
    mine = policy.state_dict()
    trained = [k for k in ckpt["model"] if k not in untrained]
    assert trained and all(torch.equal(mine[k], ckpt["model"][k]) for k in trained)


@needs_mpi
@pytest.mark.slow
def test_sft_writes_the_demonstrations_prompts_as_the_trained_policy_reads_them(tmp_path):
    """Demonstrations collected under the tiny VLA train π0.5, whose prompt holds each row's state:
    SFT re-encodes the instructions the shards record with the trained policy's encoder."""
    from rlvla3.cluster.compose import compose
    from rlvla3.policies.prompts import instruction_encoder
    from rlvla3.tools.sft import drop_state, load_demos

    run("rlvla3.collect", "+experiment=toy", "--episodes", "4", "--out", str(tmp_path / "demos"))
    recorded = load_demos(tmp_path / "demos")
    tiny = load_demos(tmp_path / "demos", 1, instruction_encoder(compose(["+experiment=toy"]).policy))
    np.testing.assert_array_equal(tiny["tokens"], recorded["tokens"])   # the collecting policy's own prompts
    pi05 = compose(["+experiment=toy", "policy=pi05"])
    encode = instruction_encoder(pi05.policy)
    rows = load_demos(tmp_path / "demos", 1, encode)
    assert rows["tokens"].shape == (len(recorded["tokens"]), pi05.policy.instruction_len)
    from rlvla3.envs.toy import COLORS

    texts = {f"go to the {c} square" for c in COLORS}
    for i in range(0, len(rows["tokens"]), 7):
        assert any(np.array_equal(rows["tokens"][i], encode(t, rows["proprio"][i])) for t in texts), i
    assert len({r.tobytes() for r in rows["tokens"]}) > 4 * len(texts)   # the state moves the prompt, not only the task
    # --state-dropout: each row's prompt without the state beside it; a dropped row gets it and proprio 0.
    blind = load_demos(tmp_path / "demos", 1, encode, blind=True)
    np.testing.assert_array_equal(blind["tokens"], rows["tokens"])
    assert {r.tobytes() for r in blind["tokens_blind"]} == {encode(t, None).tobytes() for t in texts}
    t = {k: torch.from_numpy(v) for k, v in blind.items()}
    idx = torch.arange(len(blind["tokens"]))
    proprio, tokens = drop_state(t, idx, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(proprio, t["proprio"]) and torch.equal(tokens, t["tokens"])
    proprio, tokens = drop_state(t, idx, 0.5, torch.Generator().manual_seed(0))
    dropped = (proprio == 0).all(1) & (t["proprio"] != 0).any(1)
    assert 0.3 < dropped.float().mean() < 0.7
    assert torch.equal(tokens[dropped], t["tokens_blind"][dropped]) and torch.equal(tokens[~dropped], t["tokens"][~dropped])
    out = run("rlvla3.sft", "--demos", str(tmp_path / "demos"), "+experiment=toy", "policy=pi05", "--steps", "3",
              "--state-dropout", "0.5", "--out", str(tmp_path / "pi05.pt"))
    assert "3 steps" in out.stdout and torch.load(tmp_path / "pi05.pt", weights_only=False)["sft"]["state_dropout"] == 0.5
    bad = subprocess.run([sys.executable, "-m", "rlvla3.sft", "--demos", str(tmp_path / "demos"), "+experiment=toy",
                          "--state-dropout", "1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--state-dropout 1.0: give a share in [0, 1)" in bad.stderr


def test_recipe_training_curve_is_a_success_rate_over_whole_versions():
    from rlvla3.tools.recipe import smoothed_success

    h = [{"episodes": 4, "success": 0.0}, {"episodes": 0, "success": 0.0}, {"episodes": 12, "success": 0.5}]
    assert smoothed_success(h, 2) == [0.0, 0.0, 0.5]
    assert smoothed_success(h, 3)[-1] == pytest.approx(6 / 16)


@needs_mpi
@pytest.mark.slow
def test_recipe_runs_every_stage_and_writes_its_numbers(tmp_path):
    """python -m rlvla3.recipe end to end on toy (grpo: the collect stage must not inherit its
    whole-episode segments), tiny sizes: the plumbing, not the learning. One RL mode (CI time):
    the other is the same stage with another mode override."""
    out = run("rlvla3.recipe", "+experiment=toy_grpo", "--out", str(tmp_path), "--demo-episodes", "16",
              "--sft-steps", "5", "--versions", "2", "--eval-episodes", "16", "--modes", "async", "--seeds", "3", timeout=900)
    r = json.loads((tmp_path / "recipe.json").read_text())
    assert [(x["mode"], x["seed"]) for x in r["rl"]] == [("async", 3)] and (tmp_path / "recipe.png").stat().st_size > 10_000
    assert "seed: 3" in (tmp_path / "rl-async-seed3" / "config.yaml").read_text().splitlines()
    for x in r["rl"]:
        assert len(x["history"]) == 2 and x["env_steps"] > 0
        assert x["eval"]["episodes"] == 16 and 0 <= x["eval"]["success_rate"] <= 1
    assert r["modes"]["async"]["seeds"] == [3] and r["modes"]["async"]["env_steps_per_s"] > 0
    assert r["sft_eval"]["episodes"] == 16
    assert "RL async seed 3" in out.stdout and "SFT" in out.stdout

    # The same plot and numbers for runs launched by hand: analysis.curves on the recipe's folders,
    # the RL run stopped before its summary (history rebuilt from its metrics), with the evaluations
    # matched to their checkpoints by what they evaluated.
    (tmp_path / "rl-async-seed3" / "summary.json").unlink()
    plot = tmp_path / "curves" / "c.png"
    curves = run("analysis.curves", str(tmp_path / "rl-async-seed3"), "--evals", str(tmp_path / "eval-async-seed3"),
                 str(tmp_path / "eval-sft"), "--out", str(plot), timeout=120)
    c = json.loads(plot.with_suffix(".json").read_text())
    assert json.dumps(c["rl"][0]["history"]) == json.dumps(r["rl"][0]["history"])   # NaN-safe, exact
    assert c["rl"][0]["eval"] == r["rl"][0]["eval"] and c["rl"][0]["eval_version"] == 2 and c["sft_eval"] == r["sft_eval"]
    assert c["modes"]["async"]["training_success_by_quarter"] == r["modes"]["async"]["training_success_by_quarter"]
    assert plot.stat().st_size > 10_000 and "async        seed 3:" in curves.stdout


def test_recipe_runs_each_mode_once_per_seed_and_summarises_a_mode_over_its_seeds(tmp_path):
    import argparse

    from rlvla3.cluster.compose import compose
    from rlvla3.tools.recipe import mode_summaries, plot, rl_runs

    cfg = compose(["+experiment=toy_grpo", "seed=7"])
    assert rl_runs(argparse.Namespace(modes="sync,async", seeds=""), cfg) == [("sync", 7), ("async", 7)]
    assert rl_runs(argparse.Namespace(modes="async", seeds="0, 1"), cfg) == [("async", 0), ("async", 1)]
    assert rl_runs(argparse.Namespace(modes="", seeds="0,1"), cfg) == []
    with pytest.raises(SystemExit, match="--seeds='0;1': give whole numbers separated by commas"):
        rl_runs(argparse.Namespace(modes="async", seeds="0;1"), cfg)
    with pytest.raises(SystemExit, match="--modes='sync,asnyc': no mode 'asnyc'; choose from async,sync"):
        rl_runs(argparse.Namespace(modes="sync,asnyc", seeds=""), cfg)

    def run_of(mode, seed, success, env_steps, wall, stale=(0.0, 0.0)):
        history = [{"version": v + 1, "episodes": 8, "success": success, "env_steps": env_steps / 2, "t": wall * (v + 1) / 2,
                    "stale_share": stale[v]} for v in range(2)]
        return {"mode": mode, "seed": seed, "history": history, "wall_s": wall, "env_steps": env_steps,
                "eval": {"success_rate": success, "wilson95": [success - 0.1, success + 0.1], "episodes": 50}}

    runs = [run_of("sync", 0, 0.2, 1000, 100), run_of("sync", 1, 0.4, 1000, 300),
            run_of("async", 0, 0.3, 1200, 100, (0.0, 1.0)), run_of("async", 1, 0.5, 800, 100, (1.0, 1.0))]
    m = mode_summaries(runs)
    assert list(m) == ["sync", "async"] and m["sync"]["seeds"] == [0, 1]
    assert m["sync"]["mean_success"] == pytest.approx(0.3) and m["sync"]["env_steps_per_s"] == pytest.approx(5.0)
    assert m["async"]["mean_success"] == pytest.approx(0.4) and m["async"]["env_steps_per_s"] == pytest.approx(10.0)
    assert m["sync"]["stale_share"] == 0 and m["async"]["stale_share"] == pytest.approx(0.75)   # over every version of both seeds
    for h in runs[0]["history"]:   # a run kept from before histories had the field
        del h["stale_share"]
    assert mode_summaries(runs)["sync"]["stale_share"] == 0 and np.isnan(mode_summaries(runs[:1])["sync"]["stale_share"])
    plot({"rl": runs, "modes": m, "sft_eval": {"wilson95": [0.1, 0.2]}}, tmp_path / "recipe.png")   # four runs, one figure
    assert (tmp_path / "recipe.png").stat().st_size > 10_000


def test_training_success_by_quarter_pools_the_seeds_over_the_versions_every_run_reached():
    from rlvla3.tools.episodes import wilson
    from rlvla3.tools.recipe import success_by_quarter

    def history(successes):   # 8 episodes and 100 env steps a version
        return [{"version": v + 1, "episodes": 8, "success": k / 8, "env_steps": 100} for v, k in enumerate(successes)]

    parts = success_by_quarter([history(range(8)), history([8] * 6)])   # 6 versions in common
    assert [q["versions"] for q in parts] == [[1, 1], [2, 3], [4, 4], [5, 6]]
    assert [q["episodes"] for q in parts] == [16, 32, 16, 32]
    assert [q["success"] for q in parts] == [8 / 16, 19 / 32, 11 / 16, 25 / 32]
    assert parts[0]["wilson95"] == list(wilson(8, 16))
    assert [q["env_steps"] for q in parts] == [50, 200, 350, 500]   # the quarters' middles
    assert [q["versions"] for q in success_by_quarter([history([1, 2])])] == [[1, 1], [2, 2]]


def test_average_last_checkpoints_is_the_mean_of_the_run_versions_ending_there(tmp_path):
    import torch

    from rlvla3.tools.evaluate import average_checkpoints

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for v in range(1, 5):   # version v holds weights v
        torch.save({"model": {"w": torch.full((2, 3), float(v)), "step": torch.tensor(v)}}, ckpt / f"v{v:06d}.pt")
    torch.save({"model": {"w": torch.full((2, 3), 9.0), "step": torch.tensor(9)}}, ckpt / "v000003-s0001.pt")   # preempted mid-version
    out = average_checkpoints(ckpt / "v000003.pt", 2, tmp_path / "avg.pt")
    avg = torch.load(out, weights_only=True)
    assert torch.equal(avg["model"]["w"], torch.full((2, 3), 2.5))     # versions 2 and 3, not 4
    assert avg["model"]["step"].dtype == torch.int64 and avg["averaged"] == ["v000002.pt", "v000003.pt"]
    with pytest.raises(SystemExit, match="holds only 3 checkpoints up to v000003.pt"):
        average_checkpoints(ckpt / "v000003.pt", 4, tmp_path / "avg.pt")


@needs_mpi
def test_evaluation_of_a_grpo_run_starts_every_episode_from_its_own_state(tmp_path):
    """GRPO training resets a group's envs from one shared seed; an evaluation must not, or its N
    episodes would be N / group_size initial states and the Wilson interval would be too narrow."""
    import numpy as np
    import torch

    from rlvla3.cluster.compose import compose
    from rlvla3.engine import shards
    from rlvla3.policies import make_policy
    from rlvla3.world import spec

    cfg = compose(["+experiment=toy_grpo"])
    torch.save({"model": make_policy(cfg, spec(cfg)).state_dict()}, tmp_path / "init.pt")
    run("rlvla3.evaluate", "--checkpoint", str(tmp_path / "init.pt"), "--episodes", "32", "--out", str(tmp_path / "eval"),
        "+experiment=toy_grpo", "runtime.tensorboard=false", timeout=300)
    # 32 episodes = 2 rounds of env.num_envs=16; the engine may have run a round ahead.
    names = [n for n in shards.scan(tmp_path / "eval" / "shards") if shards.parse_name(n)[0] < 2]
    firsts = [shards.read_shard(tmp_path / "eval" / "shards" / n)[0] for n in names]
    starts = np.concatenate([a["images"][0].reshape(a["images"].shape[1], -1) for a in firsts])
    assert len(starts) == 32
    distinct = len({s.tobytes() for s in starts})
    # Groups of 8 envs: shared seeds would give at most 4 distinct first observations.
    assert distinct > 24, f"only {distinct} distinct initial observations in 32 evaluation episodes"


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_evaluate_names_a_checkpoint_that_does_not_load_and_never_advises_unsafe_loading(tmp_path, damage):
    import torch

    bad = tmp_path / "v000001.pt"
    if damage == "garbage":
        bad.write_text("not a checkpoint")
    else:
        torch.save({"model": {"w": torch.zeros(4096)}}, bad)
        bad.write_bytes(bad.read_bytes()[:3000])      # a crash or a full disk cut it short
    out = subprocess.run([sys.executable, "-m", "rlvla3.evaluate", "--checkpoint", str(bad), "+experiment=toy",
                          "--out", str(tmp_path / "eval")], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"{bad}: not a readable checkpoint" in out.stderr, out.stderr[-2000:]
    assert "weights_only" not in out.stderr + out.stdout and not (tmp_path / "eval").exists()
