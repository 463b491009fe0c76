"""Trainer rank 0's scalars beside metrics/: TensorBoard and Weights & Biases (the real wandb
package in its offline mode), the same scalars against the version and against env steps, the
resolved config logged once, and a resumed run continuing the same W&B run."""
from __future__ import annotations

import json

import pytest

from tests.conftest import TOY, assert_ok, needs_mpi, run_engine, summary

pytestmark = [needs_mpi]


def log_records(path) -> list[bytes]:
    """The payloads of a .wandb file: a 7-byte header (":W&B", 0xBEE1, version), then LevelDB's
    log format (32 KiB blocks; records of crc32, length, type FULL/FIRST/MIDDLE/LAST)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, block, out, part = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:   # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):   # FULL, LAST
            out.append(part)
            part = b""
    return out


def wandb_records(run_dir):
    """(history rows, config) of the offline W&B runs under run_dir/wandb, read from their .wandb files."""
    from wandb.proto import wandb_internal_pb2

    files = sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert files, f"no offline W&B run under {run_dir / 'wandb'}"
    rows, config = [], {}
    for path in files:
        for data in log_records(path):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item})
            elif rec.WhichOneof("record_type") == "run":   # the run's config comes with it
                config.update({item.key: json.loads(item.value_json) for item in rec.run.config.update})
    return rows, config


@pytest.mark.slow
def test_wandb_and_tensorboard_get_every_version_against_versions_and_env_steps(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_SILENT", "true")
    over = [*TOY, "algo.max_versions=2", "runtime.tensorboard=true", "runtime.wandb=true", "runtime.wandb_mode=offline",
            "runtime.wandb_project=rlvla3-test"]
    proc, run = run_engine(tmp_path, over)
    assert_ok(proc)
    history = summary(run)["history"]
    rows, config = wandb_records(run)
    assert [r["version"] for r in rows] == [1, 2]
    steps = [h["env_steps"] for h in history]
    assert [r["env_steps_total"] for r in rows] == [steps[0], steps[0] + steps[1]]
    for row, h in zip(rows, history):
        assert {k: row[k] for k in ("success", "loss_policy", "env_steps")} == {k: h[k] for k in ("success", "loss_policy", "env_steps")}
    assert config["policy"]["name"] == "tiny" and config["algo"]["max_versions"] == 2
    tb = EventAccumulator(str(run / "tb")).Reload()
    assert {"success", "by_env_steps/success", "loss_policy"} <= set(tb.Tags()["scalars"])
    assert [e.step for e in tb.Scalars("by_env_steps/success")] == [steps[0], steps[0] + steps[1]]
    assert "config/text_summary" in tb.Tags()["tensors"]
    run_id = (run / "wandb_id.txt").read_text()
    assert run_id in str(sorted(run.glob("wandb/offline-run-*"))[0])

    # Resumed for a third version: the same W&B run goes on, no version logged twice.
    from rlvla3 import config
    from rlvla3.cluster.local import run_local

    proc = run_local(config.replace(config.load(run), resume=True, algo={"max_versions": 3}), run, timeout=240, capture=True)
    assert_ok(proc)
    rows, _ = wandb_records(run)
    assert [r["version"] for r in rows] == [1, 2, 3]
    assert rows[2]["env_steps_total"] == sum(h["env_steps"] for h in summary(run)["history"])
    assert all(run_id in str(p) for p in run.glob("wandb/offline-run-*"))
