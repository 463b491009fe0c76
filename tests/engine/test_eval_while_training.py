"""Evaluation while training (runtime.eval_every): Trainer 0 hands version checkpoints to an
evaluation process of their own (held-out seeds, their own envs), logs held-out success with
its Wilson interval against the version (metrics, TensorBoard, W&B), and keeps the best
checkpoint; evaluations that keep failing fail the job, naming their log."""
from __future__ import annotations

import json
import os

import pytest

from rlvla3 import config
from rlvla3.cluster.compose import compose
from rlvla3.engine import shards
from rlvla3.engine.evaluator import EvaluationError, Evaluator
from rlvla3.envs.hosting import episode_seed
from tests.conftest import TOY, assert_ok, needs_mpi, run_engine, summary
from tests.engine.test_scalars import wandb_records


@needs_mpi
@pytest.mark.slow
def test_versions_are_evaluated_on_held_out_episodes_while_training_goes_on(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_SILENT", "true")
    # FSDP's checkpoints are folders of shards (every other evaluation test reads files).
    over = [*TOY, "policy.data_parallel=fsdp", "algo.max_versions=3", "runtime.eval_every=2", "runtime.eval_episodes=8",
            "runtime.eval_envs=4", "runtime.tensorboard=true", "runtime.wandb=true", "runtime.wandb_mode=offline",
            "runtime.wandb_project=rlvla3-test"]
    proc, run = run_engine(tmp_path, over)
    assert_ok(proc)
    evals = summary(run)["evaluations"]
    assert sorted(e["version"] for e in evals) == [2, 3], "every eval_every-th version, and the last"
    for e in evals:
        r = json.loads((run / "eval" / f"v{e['version']:06d}" / "eval.json").read_text())
        assert r["checkpoint"].endswith(f"ckpt/v{e['version']:06d}.dcp") and r["episodes"] == e["episodes"] == 8
        assert (e["success"], e["success_lo"], e["success_hi"]) == (r["success_rate"], *r["wilson95"])
        assert e["success_lo"] <= e["success"] <= e["success_hi"]
        assert f"[eval] version {e['version']}: held-out success" in proc.stdout

    # Held out: the evaluation's episodes start from seeds the training envs never use.
    cfg = config.load(run)
    training = {episode_seed(cfg.seed, env, k, cfg.env.num_envs) for env in range(cfg.env.num_envs) for k in range(2000)}
    evaluated = set()
    for e in evals:
        folder = run / "eval" / f"v{e['version']:06d}" / "shards"
        evaluated |= {s for n in shards.scan(folder) for s in shards.read_attrs(folder / n)["reset_seeds"]}
    assert len(evaluated) >= 8 and not evaluated & training

    # The best checkpoint: the version with the highest held-out success (the earlier on a tie).
    best = max(evals, key=lambda e: (e["success"], -e["version"]))
    kept = json.loads((run / "ckpt" / "best.json").read_text())
    assert kept["version"] == best["version"] and kept["checkpoint"] == f"v{best['version']:06d}.dcp"
    assert os.path.samefile(run / "ckpt" / "best.dcp" / "__0_0.distcp", run / "ckpt" / kept["checkpoint"] / "__0_0.distcp")

    tb = EventAccumulator(str(run / "tb"), size_guidance={"images": 0}).Reload()
    assert sorted(e.step for e in tb.Scalars("eval/success")) == [2, 3]
    assert {t.split("/")[0] for t in tb.Tags()["images"]} == {"eval_videos"}
    rows, _ = wandb_records(run)
    logged = {r["eval/version"]: r for r in rows if "eval/version" in r}
    assert sorted(logged) == [2, 3] and all(logged[e["version"]]["eval/success"] == e["success"] for e in evals)
    assert [r["version"] for r in rows if "loss_policy" in r] == [1, 2, 3], "the training rows as without evaluations"


def test_evaluations_that_keep_failing_fail_the_job_naming_their_log(tmp_path):
    cfg = config.replace(compose(["+experiment=toy"]), runtime={"eval_every": 1, "eval_timeout": 60})
    config.save(cfg, tmp_path)
    said = []
    ev = Evaluator(cfg, tmp_path, said.append)
    for version in (1, 2):
        ev.submit(version, tmp_path / "ckpt" / f"v{version:06d}.pt")   # no such file: the evaluation exits 1
        assert ev.poll() == [] and ev.running is not None, "submit starts the process and returns at once"
        if version == 1:
            assert ev.finish() == [] and "evaluation of version 1 failed (exit code 1)" in said[0]
        else:
            with pytest.raises(EvaluationError, match=r"2 evaluations in a row failed.*runtime.eval_every=0") as e:
                ev.finish()
            assert str(tmp_path / "logs" / "eval-v000002.log") in str(e.value)
    assert "no such checkpoint" in (tmp_path / "logs" / "eval-v000002.log").read_text()
