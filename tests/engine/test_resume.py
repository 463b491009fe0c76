"""Resume paths, driven in one process (engine/inprocess.py) so each is seconds: a quarantined
shard, deleted shards, a damaged checkpoint or shard, shards of versions not yet committed.
Each test failed before its fix (the defect numbers are the reliability review's)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvla3 import config
from rlvla3.cluster.compose import compose
from rlvla3.engine import checkpoints, shards
from rlvla3.engine.inprocess import InProcessRun
from tests.conftest import EMULATED_FAST, check_every_shard_consumed_once, replace_entry


def run(run_dir: Path, versions: int, *extra, resume: bool = False) -> InProcessRun:
    cfg = compose([*EMULATED_FAST, f"algo.max_versions={versions}", *extra])
    if resume:
        cfg = config.replace(cfg, resume=True)
    r = InProcessRun(cfg, run_dir)
    r.run(timeout=120)
    return r


def versions_done(run_dir: Path) -> int:
    return json.loads((run_dir / "summary.json").read_text())["versions"]


def test_resume_after_a_quarantined_shard_continues_past_it(tmp_path):
    """Counting a group's shards gave a seq that already existed once one was quarantined:
    the next write failed with 'Directory not empty' on every resume."""
    run(tmp_path, 2)
    victim = next(n for n in shards.scan(tmp_path / "shards") if shards.parse_name(n)[1] == 0)
    shards.quarantine(tmp_path / "shards" / victim, "test")
    run(tmp_path, 4, resume=True)
    assert versions_done(tmp_path) == 4


def test_keep_shards_false_never_deletes_uncommitted_rows_nor_rolls_out_old_steps(tmp_path):
    """keep_shards=false deleted every trained version's shards, checkpointed or not; a resume then
    restarted each group near seq 0 and rolled the whole history out again."""
    from rlvla3.engine.trainer import Trainer

    extra = ("runtime.keep_shards=false", "runtime.ckpt_every=2")

    def committed_rows_kept(r: InProcessRun) -> None:
        ckpts = checkpoints.all_ckpts(tmp_path / "ckpt")
        committed = checkpoints.ckpt_order(ckpts[-1])[0] if ckpts else 0
        for step in range(committed, r.role(Trainer).version):
            names = [n for n in shards.scan(tmp_path / "shards") if shards.parse_name(n)[0] == step]
            assert names, f"step {step} is trained, not committed (last checkpoint v{committed}), and its shards are gone"

    r = InProcessRun(compose([*EMULATED_FAST, "algo.max_versions=3", *extra]), tmp_path)
    r.run(timeout=120, check=committed_rows_kept)
    assert all(shards.parse_name(n)[0] >= 3 for n in shards.scan(tmp_path / "shards"))   # committed, then deleted
    seen = set()

    def no_old_step_rolled_out_again(r: InProcessRun) -> None:
        steps = {shards.parse_name(n)[0] for n in shards.scan(tmp_path / "shards")}
        seen.update(steps)
        assert not steps or min(steps) >= 3, sorted(steps)

    r = InProcessRun(config.replace(compose([*EMULATED_FAST, "algo.max_versions=5", *extra]), resume=True), tmp_path)
    r.run(timeout=120, check=no_old_step_rolled_out_again)
    assert versions_done(tmp_path) == 5 and seen and min(seen) == 3


def test_a_truncated_newest_checkpoint_falls_back_to_the_one_before(tmp_path, capsys):
    run(tmp_path, 3)
    newest = tmp_path / "ckpt" / "v000003.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    run(tmp_path, 4, resume=True)
    out = capsys.readouterr().out
    assert f"checkpoint {newest} does not load" in out and "resumed from v000002.pt" in out
    assert versions_done(tmp_path) == 4
    check_every_shard_consumed_once(tmp_path, 4, 64)


def test_a_rescanned_shard_with_broken_attributes_is_quarantined(tmp_path):
    """A torn zarr.json among the shards a resume re-announces raised JSONDecodeError in the
    Trainer's start-up on every resume."""
    run(tmp_path, 2)
    (tmp_path / "ckpt" / "v000002.pt").unlink()          # resume from v1: step 1 is trained again
    victim = next(n for n in shards.scan(tmp_path / "shards") if shards.parse_name(n)[0] == 1)
    replace_entry(tmp_path / "shards" / victim, "zarr.json", b"{")
    run(tmp_path, 3, resume=True)
    assert versions_done(tmp_path) == 3
    assert any(p.name.startswith(victim) for p in (tmp_path / "shards" / ".bad").iterdir())


def test_rows_of_weights_a_rollback_lost_are_not_taken_as_on_policy(tmp_path):
    """Resume from v2 after v3 was published (ckpt_every=2) but never committed: the rescanned
    step-3 rows were produced by that lost version 3, and the resumed run's own version 3 took
    them as fresh (log pi_prox := their behaviour log-prob). check_logprobs shows it: the
    recomputed log-probs of "fresh" rows differed from their recorded ones (by 0.03 here), where
    rows that really are on-policy match exactly in one process."""
    from shutil import rmtree

    from rlvla3.engine.metrics import read_records
    from tests.conftest import TOY

    toy = [*TOY, "algo.update_epochs=1", "algo.check_logprobs=true", "runtime.ckpt_every=2"]
    InProcessRun(compose([*toy, "algo.max_versions=4"]), tmp_path).run(timeout=240)
    (tmp_path / "ckpt" / "v000004.pt").unlink()          # the crash: versions 3 and 4 are lost
    assert any(shards.read_attrs(tmp_path / "shards" / n)["max_version"] == 3 for n in shards.scan(tmp_path / "shards")
               if shards.parse_name(n)[0] == 3), "the test needs step-3 rows made by the lost version 3"
    rmtree(tmp_path / "metrics")
    # In one process the resumed run would retrain step 2 exactly as the lost run did; another
    # entropy bonus makes its version 3 differ from the lost one, as arrival order does across processes.
    resumed = compose([*toy, "algo.max_versions=4", "algo.ent_coef=0.2"])
    InProcessRun(config.replace(resumed, resume=True), tmp_path).run(timeout=240)
    diffs = {rec["version"]: rec["v"] for _, _, rec in read_records(tmp_path, "scalar") if rec["n"] == "logp_diff_max"}
    assert diffs and max(diffs.values()) < 1e-3, diffs


def test_mid_version_resume_keeps_its_cursor_when_a_shard_before_it_is_gone(tmp_path):
    """A mid-version checkpoint's cursor is a position in the step's shard order; a shard before
    it that is gone on resume (quarantined) shifted every position: the next shard was never
    trained and the rollout step never completed."""
    from rlvla3.engine.learners import EmulatedLearner
    from rlvla3.engine.run import Preemption
    from rlvla3.engine.trainer import Trainer

    requeued = []
    pre = Preemption(requeue=lambda: requeued.append(1))
    cfg = compose([*EMULATED_FAST, "algo.max_versions=4", "algo.update_epochs=2"])
    r = InProcessRun(cfg, tmp_path, preemption=pre)
    r.run(timeout=120, check=lambda r: pre.handler(None, None) if r.role(Trainer).plan.step_in_version == 1 and
          r.role(Trainer).version == 1 else None, until=lambda r: bool(requeued))
    mid = [p for p in checkpoints.all_ckpts(tmp_path / "ckpt") if "-s" in p.name][-1]
    state = EmulatedLearner.load(mid)
    order, cursor = json.loads(state["order"]), state["cursor"]
    assert cursor[0] >= 1, (order, cursor)
    shards.quarantine(tmp_path / "shards" / order[0][0], "test: gone before the resume")
    r = InProcessRun(config.replace(cfg, resume=True), tmp_path)
    r.run(timeout=120)
    assert versions_done(tmp_path) == 4
    state = EmulatedLearner.load(checkpoints.all_ckpts(tmp_path / "ckpt")[-1])
    on_disk = [n for n in shards.scan(tmp_path / "shards") if shards.parse_name(n)[0] < 4]
    assert all(state["ledger"]["rows"].get(n) == shards.read_attrs(tmp_path / "shards" / n)["rows"] for n in on_disk)
    assert state["rows_trained"] == 4 * 64


def test_sync_resume_with_groups_a_segment_apart_finishes(tmp_path):
    """mode=sync, killed between two shard renames of one rollout round: on resume group 0 is one
    segment ahead of group 1, across a rollout-step boundary. The Generator's lockstep round
    waited for every group, but group 0's request (next step) is held for credits the Trainer
    gives only after group 1's segment; and the Simulator's send gate waited for group 0 to be
    ready again. Both hung forever, and again after every requeue."""

    sync = ["mode=sync"]
    run(tmp_path, 2, *sync)
    shards_dir = tmp_path / "shards"
    last = max((n for n in shards.scan(shards_dir) if shards.parse_name(n)[1] == 0), key=lambda n: shards.parse_name(n)[2])
    step, gid, seq = shards.parse_name(last)
    segments_per_step = sum(1 for n in shards.scan(shards_dir) if shards.parse_name(n)[:2] == (0, 0))
    ahead_step = (seq + 1) // segments_per_step
    assert ahead_step == step + 1, "the test needs the extra segment to open the next rollout step"
    ahead = shards.shard_name(ahead_step, gid, seq + 1)
    a, attrs = shards.read_shard(shards_dir / last)
    shards.write_shard(shards_dir, ahead, a, a["bootstrap"], {**attrs, "step": ahead_step, "seq": seq + 1})
    run(tmp_path, 3, *sync, resume=True)
    assert versions_done(tmp_path) == 3


@pytest.mark.parametrize("sharding", [[], ["policy.data_parallel=fsdp"]], ids=["replicate", "fsdp"])
def test_a_mid_version_resume_republishes_the_weights_its_version_named(tmp_path, sharding):
    """A mid-version checkpoint holds a model that moved on from the version's start; the resume
    published that model under the same version number, so the rows it then produced passed as
    made by the version's weights (one number, two policies). bench faults checks the same with
    the fingerprints every publish records. With FSDP the checkpoint is a folder of shards
    holding π_prox beside the model, loaded in place."""
    import numpy as np

    from rlvla3.engine.generator import Generator
    from rlvla3.engine.run import Preemption
    from rlvla3.engine.trainer import Trainer
    from tests.conftest import TOY

    published: dict[int, np.ndarray] = {}

    def record(r: InProcessRun) -> None:
        g = r.role(Generator)
        if g.version >= 0 and g.version not in published:
            published[g.version] = g.weights_buf.copy()

    def preempt_mid_version_1(r: InProcessRun) -> None:
        record(r)
        t = r.role(Trainer)
        if t.version == 1 and t.plan.step_in_version == 2:
            pre.handler(None, None)

    requeued = []
    pre = Preemption(requeue=lambda: requeued.append(1))
    cfg = compose([*TOY, "mode=async", "mode.eta=1", "algo.max_versions=3", *sharding])
    InProcessRun(cfg, tmp_path, preemption=pre).run(timeout=240, check=preempt_mid_version_1, until=lambda r: bool(requeued))
    mid = checkpoints.all_ckpts(tmp_path / "ckpt")[-1]
    assert checkpoints.ckpt_order(mid)[0] == 1 and checkpoints.ckpt_order(mid)[1] > 0, mid.name
    assert checkpoints.is_sharded(mid) == bool(sharding) and "prox" in checkpoints.read(mid)
    before, published = dict(published), {}
    InProcessRun(config.replace(cfg, resume=True), tmp_path).run(timeout=240, check=record, until=lambda r: 1 in published)
    assert np.array_equal(published[1], before[1]), "version 1 was republished with other weights"


def test_a_resume_before_the_first_checkpoint_trains_the_shards_on_disk(tmp_path):
    """Killed before its first checkpoint (here: during version 1's weight publish, which comes
    before that checkpoint), a job left step-0 shards and no checkpoint. The resume started
    from scratch without announcing them, while the Simulators went on past them: step 0 never
    completed and the job hung."""
    run(tmp_path, 1)
    for p in (tmp_path / "ckpt").iterdir():
        p.unlink()
    run(tmp_path, 2, resume=True)
    assert versions_done(tmp_path) == 2
    check_every_shard_consumed_once(tmp_path, 2, 64)


def test_a_shard_announced_twice_is_trained_once(tmp_path):
    """A resume's rescan and a ShardReady sent while it ran (colocated multi-Trainer start-up)
    can announce one shard twice; both copies entered the step's plan and the shard's rows were
    trained twice, displacing another's (or the ledger refused to move back)."""
    from rlvla3.engine.trainer import Trainer

    run(tmp_path, 2)
    (tmp_path / "ckpt" / "v000002.pt").unlink()   # back to version 1, with step 1's shards on disk
    r = InProcessRun(config.replace(compose([*EMULATED_FAST, "algo.max_versions=2"]), resume=True), tmp_path)
    trainer = r.role(Trainer)
    before = list(trainer.plan.announced[1])
    assert before, "the test needs rescanned shards of step 1"
    trainer._announce(before[0])
    assert trainer.plan.announced[1] == before   # one shard, counted once toward its step's rows
    r.run(timeout=120)
    check_every_shard_consumed_once(tmp_path, 2, 64)


def test_a_torn_sharded_checkpoint_falls_back_to_the_one_before(tmp_path, capsys):
    """DCP raises a failed read as a BaseException: a sharded folder with a shard cut short stopped
    the resume instead of passing over it, as a torn checkpoint file is."""
    fsdp = ("policy.data_parallel=fsdp",)
    from tests.conftest import TOY

    InProcessRun(compose([*TOY, "algo.max_versions=3", *fsdp]), tmp_path).run(timeout=240)
    newest = tmp_path / "ckpt" / "v000003.dcp"
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(checkpoints.CheckpointError, match="its shards do not read"):
        checkpoints.read(newest)
    cfg = config.replace(compose([*TOY, "algo.max_versions=4", *fsdp]), resume=True)
    InProcessRun(cfg, tmp_path).run(timeout=240)
    out = capsys.readouterr().out
    assert f"checkpoint {newest} does not load" in out and "its shards do not read" in out
    assert "resumed from v000002.dcp" in out and versions_done(tmp_path) == 4
