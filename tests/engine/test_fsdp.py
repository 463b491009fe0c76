"""policy.data_parallel=fsdp: FSDP2 over real gloo ranks (torch.distributed.run), and through the
engine over real MPI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SYNC_PARITY, assert_ok, final_checkpoint, needs_mpi, run_engine

WORKER = Path(__file__).with_name("fsdp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory) -> dict[str, list[dict]]:
    """compute dtype -> each rank's results of fsdp_worker.py (one run of two gloo ranks)."""
    out = tmp_path_factory.mktemp("fsdp")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(WORKER),
                           str(out), "float32,bfloat16"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return {dtype: [json.loads((out / f"{dtype}-rank{r}.json").read_text()) for r in range(2)]
            for dtype in ("float32", "bfloat16")}


@pytest.mark.slow
def test_a_sharded_step_over_two_ranks_is_the_whole_models_step_and_its_state_round_trips(worker_results):
    """Each rank trains on half the rows: FSDP's summed gradients give the one-process step
    (float32; the LoRA base computes in its own bf16 as on the Generators, not upcast). A sharded
    checkpoint (each rank writes its shards) read whole is that step's model, and it loads back
    into a fresh sharded replica exactly, Adam's moments included, uneven shards too (π0.5's
    [1, 49, 64] position table splits 1 / 0 over two ranks)."""
    for r in worker_results["float32"]:
        assert r["max_param_diff"] <= 1e-5, r
        assert r["missing"] == [] and r["unexpected"] == [], r
        assert r["round_trip"] == 0.0 and r["opt_round_trip"] == 0.0 and r["moments"] > 0, r


@pytest.mark.slow
def test_bfloat16_computes_in_bf16_and_keeps_float32_masters_and_gradients(worker_results):
    for r in worker_results["bfloat16"]:
        assert r["masters"] == ["torch.float32"] and r["grads_fp32"], r
        assert 0 < r["max_param_diff"] < 0.01, r   # bf16 forwards: close to the float32 step, not equal
        assert r["round_trip"] == 0.0 and r["opt_round_trip"] == 0.0, r


def logp_diffs(run: Path) -> list[dict]:
    rows = [json.loads(line) for f in (run / "metrics").glob("*.jsonl") for line in f.read_text().splitlines()]
    return [r for r in rows if r.get("n") == "logp_diff_max"]


@needs_mpi
@pytest.mark.slow
def test_fsdp_over_two_trainers_trains_as_one_replicated_trainer_and_resumes_on_one(tmp_path, one_trainer_run):
    """Sync mode sees the same rows whatever the Trainer count. Every version's weights, gathered
    from the shards and published, reproduce the Trainer's log-probs exactly. Each rank writes its
    shards of a checkpoint folder; a resume on one Trainer reads the two ranks' shards back
    (resharded as they are read): its next version's log-probs still match."""
    fsdp = [*SYNC_PARITY, "policy.data_parallel=fsdp", "cluster.train_ranks=2"]
    r1 = one_trainer_run
    p2, r2 = run_engine(tmp_path, fsdp, name="fsdp")
    assert_ok(p2)
    a, b = final_checkpoint(r1), final_checkpoint(r2)
    assert sorted(p.name for p in (r2 / "ckpt").iterdir()) == ["v000001.dcp", "v000002.dcp"]
    assert sorted(p.name for p in (r2 / "ckpt" / "v000002.dcp").iterdir()) == [".metadata", "__0_0.distcp",
                                                                              "__1_0.distcp", "trainer.pt"]
    assert a["model"].keys() == b["model"].keys()
    assert max(float((a["model"][k] - b["model"][k]).abs().max()) for k in a["model"]) <= 1e-5
    moved = max(float((a["model"][k] - v).abs().max()) for k, v in final_checkpoint_at(r1, 1)["model"].items())
    assert moved > 1e-3   # the versions trained
    checks = logp_diffs(r2)
    assert {c["version"] for c in checks} == {0, 1} and max(c["v"] for c in checks) == 0.0

    p3, _ = run_engine(tmp_path, [*fsdp, "cluster.train_ranks=1", "algo.max_versions=3", "resume=true"], name="fsdp")
    assert_ok(p3)
    assert "resumed from v000002.dcp" in p3.stdout
    after = [c for c in logp_diffs(r2) if c["version"] == 2]
    assert after and max(c["v"] for c in after) == 0.0
    assert final_checkpoint(r2)["opt_step"] == 3 * b["opt_step"] // 2


def final_checkpoint_at(run: Path, version: int) -> dict:
    from rlvla3.engine.checkpoints import read

    return read(run / "ckpt" / f"v{version:06d}.pt")
