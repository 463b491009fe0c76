"""The warm-start recipe's tools on toy: expert demonstrations -> SFT -> evaluation over the real
engine (whole episodes from held-out seeds, Wilson interval)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlvla3.evaluate import wilson
from tests.conftest import needs_mpi


def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


def test_wilson_interval_matches_known_values():
    lo, hi = wilson(50, 100)
    assert abs(lo - 0.4038) < 1e-3 and abs(hi - 0.5962) < 1e-3
    lo, hi = wilson(0, 20)
    assert lo == 0.0 and abs(hi - 0.1611) < 1e-3


@needs_mpi
@pytest.mark.slow
def test_sft_from_demonstrations_beats_chance_in_evaluation(tmp_path):
    run("rlvla3.collect", "+experiment=toy", "--episodes", "100", "--out", str(tmp_path / "demos"))
    out = run("rlvla3.sft", "--demos", str(tmp_path / "demos"), "+experiment=toy", "--steps", "150",
              "--out", str(tmp_path / "sft.pt"))
    assert "loss" in out.stdout
    run("rlvla3.evaluate", "--checkpoint", str(tmp_path / "sft.pt"), "--episodes", "64", "--out", str(tmp_path / "eval"),
        "+experiment=toy", "runtime.tensorboard=false")
    r = json.loads((tmp_path / "eval" / "eval.json").read_text())
    print(r)
    assert r["episodes"] == 64, "whole rounds of env.num_envs=16 episodes"
    # A uniform-random policy succeeds ~23% of the time on toy (tests/test_learning.py).
    assert r["wilson95"][0] > 0.23, r


def test_init_from_refuses_a_checkpoint_of_another_policy(tmp_path):
    import torch

    from rlvla3.launch import compose
    from rlvla3.learner import load_init
    from rlvla3.envs import spec
    from rlvla3.policies import make_policy

    cfg = compose(["+experiment=toy"])
    torch.save({"model": make_policy(cfg, spec(cfg)).state_dict()}, tmp_path / "ok.pt")
    load_init(make_policy(cfg, spec(cfg)), str(tmp_path / "ok.pt"))
    other = compose(["+experiment=toy", "policy.d_model=32"])
    with pytest.raises(RuntimeError, match=r"policy.init_from=.*ok.pt does not fit this policy"):
        load_init(make_policy(other, spec(other)), str(tmp_path / "ok.pt"))
    with pytest.raises(FileNotFoundError, match="no such checkpoint file"):
        load_init(make_policy(cfg, spec(cfg)), str(tmp_path / "missing.pt"))
