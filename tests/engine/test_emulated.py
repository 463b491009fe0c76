"""The real engine with emulated costs: many ranks, no torch and no simulator in any rank."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from rlvla3 import config
from rlvla3.cluster.local import mpi_env, mpiexec_command
from rlvla3.engine import shards
from rlvla3.engine.metrics import read_records, read_summaries
from rlvla3.world import derive
from tests.conftest import assert_ok, check_every_shard_consumed_once, needs_mpi, run_engine, summary
from tests.engine.test_engine import _resume_cfg

pytestmark = [needs_mpi, pytest.mark.slow]

EMULATED = ["+experiment=emulated", "env.num_envs=8", "env.horizon=12", "env.step_ms=4", "env.reset_ms=10",
            "algo.segment_steps=8", "algo.rollout_batch=64", "algo.global_batch=32", "algo.micro_batch=32",
            "algo.max_versions=3", "cluster.sim_ranks=2", "cluster.gen_ranks=2", "cluster.train_ranks=2",
            "policy.train_samples_per_s=4000", "runtime.liveness_timeout=20"]
# Three Generators in a chain: Trainer 0 -> Generator -> Generator -> Generator (the relay tree at its deepest).
# Each publish in 8 buckets (200,000 float32 in 0.1 MiB); requests compressed (variable-size MPI messages).
RELAY_CHAIN = [*(o for o in EMULATED if not o.startswith("cluster.gen_ranks")), "cluster.gen_ranks=3",
               "generator.weights_fanout=1", "policy.emulated_params=200000", "generator.weights_bucket_mb=0.1",
               "runtime.obs_compression=delta-lz4"]


def test_emulated_ranks_import_neither_torch_nor_a_simulator_and_train_every_row(tmp_path):
    p, run = run_engine(tmp_path, RELAY_CHAIN, name="emu")
    assert_ok(p)
    ranks = read_summaries(run)
    assert len(ranks) == 7, f"expected 7 rank summaries, got {len(ranks)}"
    for r in ranks:
        assert r["heavy_modules"] == [], f"rank {r['rank']} ({r['role']}) imported {r['heavy_modules']}"
    check_every_shard_consumed_once(run, 3, 64)
    assert summary(run)["versions"] == 3
    # Every version reached every Generator down the relay chain, in order, once.
    loaded = {}
    for rank, role, rec in read_records(run, "span"):
        if role == "generator" and rec["n"] == "weight_sync":
            loaded.setdefault(rank, []).append(rec["version"])
    assert loaded == {g: [0, 1, 2, 3] for g in (2, 3, 4)}, loaded
    check_replies_from_whole_versions(run)
    # The data-parallel Trainers stay in step: same (emulated) parameters.
    assert (run / "params-trainer0.sha256").read_text() == (run / "params-trainer1.sha256").read_text()
    # Emulated checkpoints resume like real ones.
    p = subprocess.run(mpiexec_command(*_resume_cfg(run, 5)), env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert_ok(p)
    assert "resumed from v000003.pt" in p.stdout
    check_every_shard_consumed_once(run, 5, 64)


def check_replies_from_whole_versions(run) -> None:
    """Every reply was computed by exactly the version it names, whole: the emulated actor's value
    is a fingerprint of its weights (first and last averaged; every emulated weight counts the
    optimizer steps), so a batch served while a publish was half in would show between versions."""
    world = derive(config.load(run))
    rows = 0
    for name in shards.scan(run / "shards"):
        arrays, _ = shards.read_shard(run / "shards" / name)
        expected = arrays["versions"] * world.opt_steps_per_version
        bad = np.flatnonzero(arrays["values"].ravel() != expected.ravel())
        assert bad.size == 0, (f"{name}: {bad.size} replies whose weights are not the version they name, e.g. "
                               f"value {arrays['values'].ravel()[bad[0]]} for version {arrays['versions'].ravel()[bad[0]]}")
        rows += expected.size
    assert rows >= 3 * 64, rows


def test_generators_serve_while_a_version_arrives_and_every_reply_is_a_whole_version(tmp_path):
    """A Generator receives the next version beside serving (weights.Incoming into a second buffer)
    and swaps between batches: forwards start on a Generator while a version is arriving there
    (between its 2 MiB buckets), and still no reply comes from a half-arrived version. 5e7
    parameters make each arrival long enough to see requests in it, and the workload's credit
    (eta = 9 over 50 ms steps) keeps the Simulators stepping through it; before, a Generator
    answered nothing until the last bucket."""
    from rlvla3.benchmarks.serving import arrivals, workload

    p, run = run_engine(tmp_path, [*workload(5e7, 1, 4), "generator.weights_bucket_mb=2"], name="serve")
    assert_ok(p)
    windows = arrivals(run)
    gens = derive(config.load(run)).gen_ranks
    assert sorted(windows) == sorted(gens) and all(len(w) == 5 for w in windows.values()), windows   # versions 0-4
    served = [rec["t"] for rank, _, rec in read_records(run, "span") if rec["n"] == "infer" and
              any(t0 < rec["t"] < t1 for t0, t1 in windows.get(rank, []))]
    assert served, "no Generator served a batch while a version was arriving"
    check_replies_from_whole_versions(run)
