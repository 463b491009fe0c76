"""megatron-core backend of the Llama language model: Megatron GPTModel split over TP ranks
(real mpiexec, gloo on CPU) against transformers' LlamaForCausalLM with converted weights."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlvla3.cluster.local import mpi_env
from tests.conftest import needs_mpi

pytest.importorskip("megatron.core", reason="megatron-core not installed (pip install megatron-core==0.16.1)")
pytest.importorskip("transformers", reason="transformers not installed")


def run_check(n: int, *args: str) -> dict:
    cmd = ["mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", str(n), sys.executable, "-m", "rlvla3.tools.megatron_check", *args]
    out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_tensor_parallel_matches_transformers(tp):
    """Same logits, same gradients, and after two Adam steps the same weights exported back to
    the transformers layout (what Generators load)."""
    r = run_check(tp)
    print(r)
    assert r["tp"] == tp
    assert r["logit_diff"] < 1e-5 and r["grad_rel_diff"] < 1e-4 and r["weight_diff_after_steps"] < 1e-5, r


def test_conversion_round_trip_is_exact():
    """transformers -> Megatron TP shards -> transformers is the identity, for TP = 1, 2, 4."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvla3.engine.megatron_lm import hf_to_mcore, mcore_to_hf

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=64, tie_word_embeddings=False)
    sd = LlamaForCausalLM(cfg).state_dict()
    for tp in (1, 2, 4):
        back = mcore_to_hf([hf_to_mcore(sd, cfg, tp, r) for r in range(tp)], cfg)
        assert set(back) == set(sd)
        for k, v in sd.items():
            assert torch.equal(back[k], v), (tp, k)


@pytest.mark.gpu
def test_megatron_optimizer_on_one_gpu():
    """TP = PP = 1 on a GPU with Megatron's DDP and optimizer (GPU-only) vs transformers + torch Adam."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: Megatron's optimizer wrappers are GPU-only")
    r = run_check(1, "--gpu")
    print(r)
    assert r["logit_diff"] < 1e-3 and r["weight_diff_after_steps"] < 1e-4, r


@needs_mpi
@pytest.mark.slow
def test_engine_trains_openvla_with_a_megatron_lm_split_over_two_trainers(tmp_path):
    """policy.lm_backend=megatron: 2 Trainer ranks hold one replica (TP = 2). Generators run the
    transformers model on the exported weights; the Trainer's recomputed log-probs match theirs,
    and the checkpoint is in the transformers layout (a transformers-backend policy loads it)."""
    import torch

    from rlvla3 import config
    from rlvla3.engine.metrics import read_records
    from rlvla3.policies import make_policy
    from rlvla3.world import spec
    from tests.conftest import LOGP_CHECK, TOY, assert_ok, check_every_shard_consumed_once, final_checkpoint, run_engine

    over = [*TOY, *LOGP_CHECK, "policy=openvla", "policy.patch=3",
            "policy.lm=llama", "policy.lm_backend=megatron", "policy.tensor_parallel=2", "cluster.train_ranks=2",
            "runtime.liveness_timeout=60"]
    proc, run = run_engine(tmp_path, over, timeout=400)
    assert_ok(proc)
    check_every_shard_consumed_once(run, 2, 256)
    diffs = [rec["v"] for _, _, rec in read_records(run, "scalar") if rec["n"] == "logp_diff_max"]
    print(f"megatron TP=2: logp_diff_max {max(diffs):.2e} over {len(diffs)} checks")
    assert diffs and max(diffs) <= 1e-3
    cfg = config.load(run)
    model = final_checkpoint(run)["model"]
    plain = make_policy(config.replace(cfg, policy={"lm_backend": "transformers"}), spec(cfg))
    plain.load_state_dict(model)   # strict: the same names and shapes as the transformers policy
    assert not torch.equal(plain.lm.lm_head.weight, make_policy(cfg, spec(cfg)).lm.lm_head.weight), "training moved nothing"
