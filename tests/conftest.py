"""Shared helpers: every engine test runs the real launcher (mpiexec, real ranks, real zarr)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlvla3.cluster.compose import compose
from rlvla3.cluster.local import run_local

needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not installed (apt-get install openmpi-bin)")

# Small, fast settings for engine tests on the toy env.
TOY = ["+experiment=toy", "algo.max_versions=3", "runtime.tensorboard=false", "runtime.liveness_timeout=20"]
# Two async versions with the Trainer recomputing the fresh rows' log-probs; one epoch: the check
# needs rows, not learning.
LOGP_CHECK = ["mode=async", "algo.max_versions=2", "algo.check_logprobs=true", "algo.update_epochs=1"]
# Two sync versions on the toy, one epoch, the log-prob check on: sync mode gives every Trainer
# count the same rows, so data-parallel runs compare with the one-Trainer run (`one_trainer_run`).
SYNC_PARITY = [*TOY, "mode=sync", "algo.max_versions=2", "algo.update_epochs=1", "algo.check_logprobs=true"]
# The emulated engine at in-process speed: tiny costs, 8 envs in 4 groups, 2 optimizer steps a version.
EMULATED_FAST = ["+experiment=emulated", "env.num_envs=8", "sharding.groups_per_rank=2", "algo.segment_steps=8",
                 "algo.rollout_batch=64", "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=3",
                 "env.step_ms=1", "env.reset_ms=5", "policy.infer_fixed_ms=1", "policy.train_samples_per_s=20000"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items) -> None:
    """The test command runs two pytest-xdist workers (`-n 2 --dist loadgroup`, docs/testing.md).
    Tests that share something built once per module or session (the two toy learning runs, a
    tiny released folder, the one-Trainer run) go to one worker, so it is built once; so do the
    Slurm tests, which share the local cluster. Marks an `xdist_group` per set of such tests."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    shared_of = {}
    for item in items:
        keys = ["slurm"] if item.get_closest_marker("slurm") else []
        for name, defs in item._fixtureinfo.name2fixturedefs.items():
            d = defs[-1]
            if d.scope in ("module", "session") and d.baseid.startswith("tests"):   # ours, not pytest's own
                keys.append(f"{d.baseid}::{name}")
        for k in keys[1:]:
            parent[root(k)] = root(keys[0])
        shared_of[item] = keys
    for item, keys in shared_of.items():
        if keys:
            item.add_marker(pytest.mark.xdist_group(root(keys[0])))


def run_engine(tmp_path: Path, overrides: list[str], timeout: float = 240, name: str = "run"):
    run_dir = tmp_path / name
    proc = run_local(compose(overrides), run_dir, timeout=timeout, capture=True)
    return proc, run_dir


@pytest.fixture(scope="session")
def one_trainer_run(tmp_path_factory) -> Path:
    """SYNC_PARITY on one replicated Trainer, run once for the data-parallel tests."""
    proc, run = run_engine(tmp_path_factory.mktemp("parity"), SYNC_PARITY, name="one")
    assert_ok(proc)
    return run


def final_checkpoint(run_dir: Path) -> dict:
    """The latest checkpoint (version ends and mid-version preemption points, in order), in
    either learner's format (torch, the emulated learner's npz, or a sharded folder's model read
    whole)."""
    from rlvla3 import config
    from rlvla3.engine.checkpoints import all_ckpts, read

    path = all_ckpts(run_dir / "ckpt")[-1]
    if config.load(run_dir).policy.name == "emulated":
        from rlvla3.engine.learners import EmulatedLearner
        return EmulatedLearner.load(path)
    return read(path)


def check_every_shard_consumed_once(run_dir: Path, versions: int, rollout_batch: int) -> None:
    """Every committed row of every trained step entered training exactly once: none lost, none
    twice, and rows trained = versions x rollout_batch = the ledger's sum."""
    from rlvla3.engine import shards

    state = final_checkpoint(run_dir)
    ledger = state["ledger"]["rows"]
    trained = [n for n in shards.scan(run_dir / "shards") if shards.parse_name(n)[0] < versions]
    for n in trained:
        rows = shards.read_attrs(run_dir / "shards" / n)["rows"]
        assert ledger.get(n) == rows, f"{n}: ledger {ledger.get(n)} of {rows} rows"
    assert set(ledger) == set(trained)
    assert state["rows_trained"] == versions * rollout_batch == sum(ledger.values())


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"


def run_logprob_check(tmp_path: Path, overrides: list[str], what: str, tol: float = 1e-3) -> Path:
    """An engine run with LOGP_CHECK among its overrides: it finishes its 2 versions, and the
    Trainer's recomputed log-probs of fresh rows are within `tol` of the Generator's. The run folder."""
    from rlvla3.engine.metrics import read_records

    proc, run = run_engine(tmp_path, overrides, timeout=400)
    assert_ok(proc)
    assert summary(run)["versions"] == 2
    diffs = [rec["v"] for _, _, rec in read_records(run, "scalar") if rec["n"] == "logp_diff_max"]
    assert diffs, "the Trainer recomputed no fresh row's log-prob"
    print(f"{what}: logp_diff_max {max(diffs):.2e} over {len(diffs)} checks")
    assert max(diffs) <= tol, f"{what}: Trainer vs Generator log-prob differ by up to {max(diffs):.2e}"
    return run


def replace_entry(shard: Path, name: str, data: bytes) -> None:
    """Rewrite one entry of a shard file (a zip of zarr 3 entries), the others as they were: how
    the tests tear or edit a published shard."""
    import zipfile

    with zipfile.ZipFile(shard) as zf:
        kept = {i.filename: zf.read(i) for i in zf.infolist()}
    kept[name] = data
    with zipfile.ZipFile(shard, "w", zipfile.ZIP_STORED) as zf:
        for n, b in kept.items():
            zf.writestr(n, b)



def obs_batch(sp, encode, n: int = 3, seed: int = 0):
    """A batch of `n` observations for a policy of spec `sp` (random frames and proprio, three
    instructions encoded by `encode`) and the noise of one sample each: (images, proprio, tokens, noise)."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (n, sp.cameras, sp.image_size, sp.image_size, 3), generator=g, dtype=torch.uint8)
    proprio = torch.randn(n, sp.proprio_dim, generator=g)
    tokens = torch.from_numpy(np.stack([encode(t) for t in ("lift", "go to the red square", "lift the cube")][:n]))
    return images, proprio, tokens, torch.randn(n, *sp.sample.noise_shape, generator=g)


def damage_tensor(path: Path, damage: str, name: str, extra: str, shape: tuple) -> str:
    """Rewrite a released folder's safetensors file with one tensor damaged: `missing` drops
    `name`, `extra` adds the tensor `extra`, `shape` gives `name` the `shape`. The name a strict
    loader must report."""
    import torch
    from safetensors.torch import load_file, save_file

    t = load_file(path)
    if damage == "missing":
        del t[name]
    elif damage == "extra":
        name, t[extra] = extra, torch.zeros(3)
    else:
        t[name] = torch.zeros(shape)
    save_file(t, path, metadata={"format": "pt"})
    return name
