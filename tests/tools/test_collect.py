"""Demonstrations: the scripted experts through `python -m rlvla3.collect` (real mpiexec over
Simulator ranks, env processes, zarr shards in the engine's format)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rlvla3.engine import shards
from rlvla3.policies.sampling import expert_sample
from tests.conftest import needs_mpi

pytestmark = [needs_mpi, pytest.mark.slow]


def collect(tmp_path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "rlvla3.collect", "--out", str(tmp_path / "demos"), *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


def read_all(run):
    return [shards.read_shard(run / "shards" / n) for n in shards.scan(run / "shards")]


def test_toy_demonstrations_over_two_ranks(tmp_path):
    collect(tmp_path, "+experiment=toy", "env.num_envs=8", "cluster.sim_ranks=2", "--episodes", "24", "--format", "lerobot")
    got = read_all(tmp_path / "demos")
    ranks = {attrs["producer_rank"] for _, attrs in got}
    assert ranks == {0, 1}, "collection is spread over the Simulator ranks"
    ends = sum(attrs["episode_ends"] for _, attrs in got)
    assert ends >= 24 and sum(attrs["successes"] for _, attrs in got) == ends, "the toy expert always succeeds"
    for a, attrs in got:
        assert attrs["source"] == "expert" and (a["versions"] == -1).all() and a["valid"].all()
        assert set(np.unique(a["actions"])) <= {-1.0, 0.0, 1.0}
        np.testing.assert_array_equal(a["sample"], (a["actions"][:, :, 0] + 1).astype(np.int32))   # 3 bins
    check_lerobot_round_trip(tmp_path / "demos")


def check_lerobot_round_trip(run):
    """collect --format lerobot: the whole episodes of the shards, read back by the LeRobot reader
    (sft --demos), are the same frames: state, actions, instructions exact, pictures through H.264;
    the folder has the v3.0 layout's files and episode columns (as tests/tools/test_lerobot.py's
    fixture, written from LeRobot's own writer, has them)."""
    import json

    import pyarrow.parquet as pq

    from rlvla3.cluster.compose import compose
    from rlvla3.policies.prompts import instruction_encoder
    from rlvla3.tools.episodes import RecordedEpisodes
    from rlvla3.tools.lerobot_dataset import load_lerobot
    from tests.tools.test_lerobot import FIXTURE_EPISODE_COLUMNS

    cfg = compose(["+experiment=toy"])
    recorded = RecordedEpisodes(run)
    episodes = list(recorded)
    assert len(episodes) >= 24 and recorded.partial > 0, "unfinished episodes are left out"
    info = json.loads((run / "lerobot" / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_episodes"] == len(episodes)
    columns = set(pq.read_schema(run / "lerobot" / "meta" / "episodes" / "chunk-000" / "file-000.parquet").names)
    assert FIXTURE_EPISODE_COLUMNS <= columns, FIXTURE_EPISODE_COLUMNS - columns
    rows = load_lerobot(run / "lerobot", cfg)
    np.testing.assert_array_equal(rows["proprio"], np.concatenate([e["proprio"] for e in episodes]))
    np.testing.assert_array_equal(rows["actions"], np.concatenate([e["actions"][:, 0] for e in episodes]))
    encode = instruction_encoder(cfg.policy)
    np.testing.assert_array_equal(rows["tokens"], np.stack([encode(e["task"]) for e in episodes for _ in e["proprio"]]))
    assert np.flatnonzero(rows["ended"]).tolist() == list(np.cumsum([len(e["proprio"]) for e in episodes]) - 1)
    source = np.concatenate([e["images"] for e in episodes]).astype(int)
    err = np.abs(rows["images"].astype(int) - source).mean((1, 2, 3, 4))
    shifted = np.abs(rows["images"][1:].astype(int) - source[:-1]).mean((1, 2, 3, 4))
    assert err.max() < 8 and (err[1:] < shifted).mean() > 0.9, (err.max(), (err[1:] < shifted).mean())   # lossy, own pictures


def test_expert_sample_layouts():
    from rlvla3.config import PolicyConfig
    from rlvla3.policies import sample_layout

    actions = np.array([[-1.0, 0.0, 1.0], [0.5, -0.5, 0.99]], np.float32)
    tok = expert_sample(sample_layout(PolicyConfig(action_bins=5), 3), actions, 5)
    np.testing.assert_array_equal(tok, [[0, 2, 4], [3, 1, 4]])
    chain = expert_sample(sample_layout(PolicyConfig(name="pi0", chunk=1, denoise_steps=2), 3), actions, 5)
    assert chain.shape == (2, 3, 1, 3) and not chain[:, :2].any()
    np.testing.assert_array_equal(chain[:, -1, 0], actions)


def test_a_task_without_an_expert_is_refused_early(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlvla3.collect", "--out", str(tmp_path / "d"), "env=robosuite_door",
                          "env.task=Wipe"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "env.task=Wipe: no scripted expert" in out.stderr
    assert not (tmp_path / "d").exists(), "nothing is written for a refused collection"


@pytest.mark.sim
def test_robosuite_lift_expert_demonstrations(tmp_path):
    # The recipe's grpo config: demonstrations are still a stream with auto-resets.
    collect(tmp_path, "+experiment=lift_grpo", "env.num_envs=2", "--episodes", "2")
    got = read_all(tmp_path / "demos")
    assert sum(attrs["successes"] for _, attrs in got) == sum(attrs["episode_ends"] for _, attrs in got) >= 2
    a, _ = got[0]
    assert a["images"].shape[2:] == (1, 64, 64, 3) and a["images"].std() > 0, "rendered frames, not blanks"
    assert np.abs(a["actions"]).max() <= 1.0 and np.abs(a["actions"][..., :3]).max() > 0.1


@pytest.mark.sim
def test_metaworld_expert_demonstrations_in_env_processes(tmp_path):
    pytest.importorskip("metaworld", reason="metaworld not installed (pip install --no-deps metaworld==3.1.1)")
    collect(tmp_path, "env=metaworld_pickplace", "algo.segment_steps=32", "--episodes", "2")
    got = read_all(tmp_path / "demos")
    assert sum(attrs["successes"] for _, attrs in got) == sum(attrs["episode_ends"] for _, attrs in got) >= 2
    a, _ = got[0]
    assert a["images"].shape[2:] == (1, 64, 64, 3) and a["images"].std() > 0
    assert a["proprio"].shape[-1] == 4 and a["actions"].shape[-1] == 4
    assert a["tokens"][0, 0, :3].tolist() != [0, 0, 0], "the instruction 'pick place' is tokenized"
