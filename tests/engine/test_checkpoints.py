"""Checkpoints written beside training (checkpoints.Saver) and kept within runtime.keep_ckpts:
the loop does not wait for the disk, what a file holds is the state at its submit, a write's error
reaches the Trainer's thread, and a run's ckpt/ holds its newest checkpoints, the best, and what an
evaluation still reads."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from rlvla3 import config
from rlvla3.cluster.compose import compose
from rlvla3.engine import checkpoints
from rlvla3.engine.inprocess import InProcessRun
from rlvla3.engine.learners import EmulatedLearner
from tests.conftest import EMULATED_FAST, summary


class GatedDisk:
    """A save that writes only once the test opens the gate: a disk as slow as the test wants."""

    def __init__(self):
        self.gate, self.started = threading.Event(), threading.Event()

    def save(self, state: dict, path) -> None:
        self.started.set()
        assert self.gate.wait(30), "the test never opened the gate"
        EmulatedLearner.save(None, state, path)


def names(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_saver_returns_before_the_disk_and_writes_the_state_at_its_submit(tmp_path):
    disk, done = GatedDisk(), []
    saver = checkpoints.Saver(disk.save, tmp_path, keep=0, timeout=30)
    params = np.arange(4, dtype=np.float32)
    saver.submit({"params": params, "version": 1}, tmp_path / "v000001.pt", then=done.append)
    assert disk.started.wait(10)
    params += 100                                   # training goes on while the file is written
    assert not saver.poll() and names(tmp_path) == [] and done == []   # nothing published yet
    disk.gate.set()
    saver.wait()
    assert done == [tmp_path / "v000001.pt"]        # its follow-up ran on this thread, once
    assert np.array_equal(EmulatedLearner.load(tmp_path / "v000001.pt")["params"], np.arange(4))
    assert not saver.poll()


def test_the_next_snapshot_reuses_the_written_ones_memory(tmp_path):
    saver = checkpoints.Saver(lambda state, path: EmulatedLearner.save(None, state, path), tmp_path, keep=0, timeout=30)
    saver.submit({"params": np.zeros(3, np.float32)}, tmp_path / "v000001.pt")
    staged = saver.staging["params"]
    saver.submit({"params": np.ones(3, np.float32)}, tmp_path / "v000002.pt")   # waits for v1 first
    saver.wait()
    assert saver.staging["params"] is staged                                   # copied into, not allocated
    assert EmulatedLearner.load(tmp_path / "v000001.pt")["params"].tolist() == [0, 0, 0]
    assert EmulatedLearner.load(tmp_path / "v000002.pt")["params"].tolist() == [1, 1, 1]
    saver.submit({"params": np.ones(4, np.float32)}, tmp_path / "v000003.pt")   # another shape: a new buffer
    saver.wait()
    assert saver.staging["params"] is not staged and EmulatedLearner.load(tmp_path / "v000003.pt")["params"].size == 4


def test_a_failed_write_is_raised_on_the_trainers_thread_and_a_stuck_one_is_named(tmp_path):
    def full_disk(state, path):
        raise OSError(28, "No space left on device")

    saver = checkpoints.Saver(full_disk, tmp_path, keep=3, timeout=30)
    saver.submit({"params": np.zeros(2)}, tmp_path / "v000001.pt")
    with pytest.raises(checkpoints.CheckpointError, match="v000001.pt failed: no space left"):
        saver.wait()
    disk = GatedDisk()
    stuck = checkpoints.Saver(disk.save, tmp_path, keep=3, timeout=0.2)
    stuck.submit({"params": np.zeros(2)}, tmp_path / "v000002.pt")
    with pytest.raises(checkpoints.CheckpointError, match=r"v000002.pt took more than runtime.ckpt_write_timeout=0.2"):
        stuck.wait()
    disk.gate.set()


def test_prune_keeps_the_newest_the_best_and_what_an_evaluation_reads(tmp_path):
    for v in range(1, 6):
        (tmp_path / checkpoints.ckpt_name(v)).write_bytes(b"x")
    (tmp_path / "v000005-s0002.pt").write_bytes(b"x")     # a preemption checkpoint counts as one
    os.link(tmp_path / "v000001.pt", tmp_path / "best.pt")
    gone = checkpoints.prune(tmp_path, keep=2, in_use={"v000002.pt"})
    assert sorted(p.name for p in gone) == ["v000001.pt", "v000003.pt", "v000004.pt"]
    assert names(tmp_path) == ["best.pt", "v000002.pt", "v000005-s0002.pt", "v000005.pt"]
    assert (tmp_path / "best.pt").read_bytes() == b"x"    # the link keeps the bytes of the deleted v1
    assert checkpoints.prune(tmp_path, keep=0) == []      # 0: keep every one


def test_sharded_checkpoint_folders_order_prune_and_link_as_files_do(tmp_path):
    """A sharded run's checkpoints are folders (v000012.dcp/): ordered with the files, pruned
    whole, kept as best.dcp by hard links that outlive the version's folder."""
    for v in range(1, 4):
        (tmp_path / checkpoints.ckpt_name(v, sharded=True)).mkdir()
        (tmp_path / checkpoints.ckpt_name(v, sharded=True) / "__0_0.distcp").write_bytes(b"%d" % v)
    (tmp_path / "v000003-s0002.tmp").mkdir()              # a write in flight is no checkpoint
    assert [p.name for p in checkpoints.all_ckpts(tmp_path)] == ["v000001.dcp", "v000002.dcp", "v000003.dcp"]
    assert checkpoints.ckpt_order(tmp_path / "v000003-s0002.dcp") == (3, 2)
    checkpoints.link_copy(tmp_path / "v000001.dcp", tmp_path / "best.dcp")
    checkpoints.link_copy(tmp_path / "v000002.dcp", tmp_path / "best.dcp")   # a better one replaces it
    gone = checkpoints.prune(tmp_path, keep=1)
    assert sorted(p.name for p in gone) == ["v000001.dcp", "v000002.dcp"]
    assert names(tmp_path) == ["best.dcp", "v000003-s0002.tmp", "v000003.dcp"]
    assert (tmp_path / "best.dcp" / "__0_0.distcp").read_bytes() == b"2"


def test_a_sharded_checkpoint_resumes_only_where_the_model_is_sharded(tmp_path):
    """A folder of FSDP shards into a replicated Trainer (or a file into FSDP ranks) is refused
    before any rank starts, naming the setting to use."""
    from rlvla3.cluster.compose import prepare_run_dir
    from rlvla3.config import ConfigError
    from tests.conftest import TOY

    (tmp_path / "ckpt" / "v000002.dcp").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"v000002.dcp was written with policy.data_parallel=fsdp, and this run has "
                       r"policy.data_parallel=replicate: resume with policy.data_parallel=fsdp"):
        prepare_run_dir(compose([*TOY, "resume=true"]), tmp_path)
    prepare_run_dir(compose([*TOY, "resume=true", "policy.data_parallel=fsdp"]), tmp_path)


def test_a_run_keeps_its_newest_checkpoints_and_resumes_from_them(tmp_path):
    most = [0]

    def count(r) -> None:
        most[0] = max(most[0], len(list((tmp_path / "ckpt").glob("*"))))

    cfg = compose([*EMULATED_FAST, "algo.max_versions=6", "runtime.keep_ckpts=2"])
    InProcessRun(cfg, tmp_path).run(timeout=120, check=count)
    assert names(tmp_path / "ckpt") == ["v000005.pt", "v000006.pt"]
    assert most[0] <= 2 + 1, most[0]                       # the kept ones and the one being written
    assert summary(tmp_path)["ckpt_stall_s"] >= 0
    resumed = config.replace(compose([*EMULATED_FAST, "algo.max_versions=8", "runtime.keep_ckpts=2"]), resume=True)
    InProcessRun(resumed, tmp_path).run(timeout=120)
    assert summary(tmp_path)["versions"] == 8 and names(tmp_path / "ckpt") == ["v000007.pt", "v000008.pt"]
