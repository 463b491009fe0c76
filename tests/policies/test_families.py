"""Every policy family through the real engine (mpiexec, Simulator/Generator/Trainer ranks, zarr
shards) on `toy` in async mode. With algo.check_logprobs the Trainer recomputes log pi of the
fresh rows with the weights that produced them; it must match the Generator's."""
from __future__ import annotations

import numpy as np
import pytest

from rlvla3.engine import shards
from rlvla3.engine.metrics import read_records
from tests.conftest import LOGP_CHECK, TOY, assert_ok, check_every_shard_consumed_once, needs_mpi, run_engine, run_logprob_check, summary

pytestmark = [needs_mpi, pytest.mark.slow]

# Summed over K*D tokens or S*K*D Gaussian terms, float32, different batch compositions on the two sides.
LOGP_TOL = 1e-3

# (autoregressive Llama decoding, pi0, pi05 and openvla_oft run through the engine from their
# published layouts: tests/policies/test_openvla_released.py, test_pi0_pretrained.py, test_pi05.py, test_openvla_oft.py)
FAMILIES = {
    "tiny_chunk2": ["policy.chunk=2"],
    # Token ratios: the Trainer's per-token π_prox forward, summed, must match the Generator's log-prob.
    "tiny_token_ratio": ["policy.chunk=2", "algo.ratio=token"],
    # A receding horizon: 2 of each chunk of 4 executed; the row keeps the whole chunk's sample.
    "tiny_chunk4_execute2": ["policy.chunk=4", "policy.execute_steps=2"],
    "openvla_parallel_qwen2": ["policy=openvla", "policy.patch=3", "policy.chunk=2"],
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_runs_async_and_logprobs_match(tmp_path, family):
    over = [*TOY, *LOGP_CHECK, *FAMILIES[family]]
    run = run_logprob_check(tmp_path, over, family, LOGP_TOL)
    check_every_shard_consumed_once(run, 2, 256)
    # The shard carries what the family needs to recompute log pi (shards.py documents it).
    a, _ = shards.read_shard(run / "shards" / shards.scan(run / "shards")[0])
    T, N = a["rewards"].shape
    K = next((int(o.split("=")[1]) for o in over if o.startswith("policy.chunk=")), 1)
    assert a["actions"].shape == (T, N, K, 2)
    assert a["sample"].shape == (T, N, K * 2) and a["sample"].dtype == np.int32
    np.testing.assert_allclose(a["actions"].reshape(T, N, -1), a["sample"] / 2 * 2 - 1)   # 3 bins: -1, 0, 1
    E = next((int(o.split("=")[1]) for o in over if o.startswith("policy.execute_steps=")), K)
    ended = a["terminated"] | a["truncated"]
    assert (a["env_steps"] >= 1).all() and (a["env_steps"][~ended] == E).all() and (a["env_steps"] <= E).all()


@pytest.mark.parametrize("algo", ["grpo", "raft"])
def test_outcome_segments_hold_whole_episodes(tmp_path, algo):
    """algo=grpo: every shard is one group's episodes from one shared reset (equal digests); algo=raft
    (no groups): each env of a shard resets from its own seed. Either way each episode ends inside
    the segment, and rows after an episode's end are marked invalid."""
    over = [*TOY, "mode=async", f"algo={algo}", "algo.segment_steps=6", "algo.rollout_batch=192", "algo.global_batch=64",
            "algo.max_versions=2", "algo.check_logprobs=true"]
    proc, run = run_engine(tmp_path, over)
    assert_ok(proc)
    check_every_shard_consumed_once(run, 2, 192)
    for name in shards.scan(run / "shards"):
        a, attrs = shards.read_shard(run / "shards" / name)
        if algo == "grpo":
            assert len(set(attrs["reset_digests"])) == 1, attrs["reset_digests"]
        else:
            assert len(set(attrs["reset_seeds"])) == len(attrs["env_ids"]), attrs["reset_seeds"]
        ended = a["terminated"] | a["truncated"]
        assert (ended.sum(0) == 1).all(), f"{name}: every env ends exactly one episode"
        last = ended.argmax(0)
        for i, t in enumerate(last):
            assert a["valid"][: t + 1, i].all() and not a["valid"][t + 1:, i].any()
            assert (a["env_steps"][t + 1:, i] == 0).all() and (a["rewards"][t + 1:, i] == 0).all()
        # After the group's last episode ended the segment is padded at once: invalid rows that
        # carry the last row's version (never a version the rows were not produced under).
        assert (a["versions"] >= a["versions"][0].min()).all()


def test_grpo_in_lockstep_never_waits_on_a_group(tmp_path):
    """mode=sync + grpo: a group whose episodes all ended early must not run ahead of the rank's
    other groups (once, it padded its segment and moved on; the lockstep batch then waited for
    it and each step took the 10 s no-progress interval)."""
    # Groups of two envs and 20-step episodes: both episodes of a group often end early.
    over = [*TOY, "mode=sync", "algo=grpo", "env.num_envs=4", "sharding.groups_per_rank=2", "env.horizon=20",
            "algo.segment_steps=20", "algo.rollout_batch=160", "algo.global_batch=80", "algo.micro_batch=80",
            "algo.max_versions=3"]
    proc, run = run_engine(tmp_path, over)
    assert_ok(proc)
    check_every_shard_consumed_once(run, 3, 160)
    # With the bug every lockstep step stalled for the 10 s report interval (one report per step);
    # one report is allowed: on a loaded machine the wait for the final Stop can pass 10 s.
    stalls = (proc.stdout + proc.stderr).count("no progress")
    assert stalls <= 1, (proc.stdout + proc.stderr)[-3000:]


def test_vtrace_with_kl_runs_async_and_logprobs_match(tmp_path):
    """V-trace targets (stale rows weighted by rho/c) and the KL term to the initial policy."""
    over = [*TOY, "mode=async", "algo=vtrace", "algo.max_versions=3", "algo.check_logprobs=true", "algo.kl_coef=0.01"]
    proc, run = run_engine(tmp_path, over)
    assert_ok(proc)
    check_every_shard_consumed_once(run, 3, 256)
    hist = summary(run)["history"]
    assert max(h["staleness_max"] for h in hist) == 1   # stale rows exercised the rho/c weights
    diffs = [rec["v"] for _, _, rec in read_records(run, "scalar") if rec["n"] == "logp_diff_max"]
    assert diffs and max(diffs) <= LOGP_TOL
