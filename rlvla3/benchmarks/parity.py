"""`python -m rlvla3.bench parity [--families openvla_oft,pi05] [--ranks 1,2,4] [overrides...]`:
FSDP over N Trainer ranks against one replicated Trainer, through the engine (real MPI, real
process groups), at tiny size in the published layouts.

Each family runs sync PPO on the toy env for `algo.max_versions` versions: sync mode gives every
Trainer count the same rows (per-request sampling noise, seeded envs, lockstep), so the trained
parameters may differ only by float summation order. Printed per run: the largest |Δθ| of the final
checkpoint and |Δ loss| of every version's policy loss against the one-rank replicated run, and
the log-prob check (the Generator's log-probs, made with the weights gathered from the shards,
recomputed by the Trainer; algo.check_logprobs).
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from ..cluster.compose import compose
from .common import chosen_families, save_rows

COMMON = ["+experiment=toy", "mode=sync", "algo.max_versions=2", "algo.update_epochs=1", "algo.check_logprobs=true",
          "runtime.tensorboard=false", "runtime.progress=false", "policy.device=cpu"]
# The families in their published layouts at tiny size: OFT from a tiny released folder (it has no
# random-init form) with LoRA over a float32 base (a bf16 base's matmuls round differently for a
# different number of rows per forward, so 1 and N ranks part ways under replicate as well), π0.5
# built from its real PaliGemma + Gemma expert classes, SmolVLA from its SmolVLM + Llama ones, GR00T from
# SigLIP + Qwen3 and its own action head.
PARITY_RUNS = {"openvla_oft": ["policy=openvla_oft", "policy.pretrained={released_oft}", "policy.lora_base_dtype=float32"],
               "pi05": ["policy=pi05", "policy.patch=3"],
               "smolvla": ["policy=smolvla", "policy.patch=3"],
               "gr00t": ["policy=gr00t", "policy.patch=3"]}


def run(a) -> int:
    import torch

    from ..cluster.local import run_local
    from .families import tiny_released_folder

    out = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-parity-"))
    ranks = [int(n) for n in (a.ranks or "1,2,4").split(",")]
    print(f"{'family':12s} {'data_parallel':13s} {'trainers':>8s} {'max|dtheta|':>12s} {'max|dloss|':>11s} "
          f"{'logp_check':>10s} {'wall_s':>7s}", flush=True)
    rows, failed = [], 0
    for name in chosen_families(a.families, PARITY_RUNS):
        folder = ""
        if "{released_oft}" in " ".join(PARITY_RUNS[name]):
            folder = tiny_released_folder(compose([*COMMON, *PARITY_RUNS[name][:1]]), oft=True, folder=str(out / "oft-folder"))
        family = [o.format(released_oft=folder) for o in PARITY_RUNS[name]]
        base = None
        for dp, n in [("replicate", 1), *(("fsdp", n) for n in ranks)]:
            run_dir = out / f"{name}-{dp}-{n}"
            cfg = compose([*COMMON, *family, f"policy.data_parallel={dp}", f"cluster.train_ranks={n}", *a.overrides])
            t0 = time.time()
            proc = run_local(cfg, run_dir, timeout=a.timeout, capture=True)
            wall = time.time() - t0
            if proc.returncode != 0:
                print(f"{name:12s} {dp:13s} {n:8d} failed (rc {proc.returncode}): {proc.stderr[-600:]}", flush=True)
                failed += 1
                continue
            got = result(run_dir, torch)
            base = base or got
            d_theta = max(float((got["model"][k] - v).abs().max()) for k, v in base["model"].items())
            d_loss = max(abs(x - y) for x, y in zip(got["losses"], base["losses"], strict=True))
            row = {"family": name, "data_parallel": dp, "trainers": n, "max_abs_dtheta": d_theta,
                   "max_abs_dloss": d_loss, "logp_diff_max": got["logp_diff_max"], "wall_s": wall}
            rows.append(row)
            print(f"{name:12s} {dp:13s} {n:8d} {d_theta:12.2e} {d_loss:11.2e} {got['logp_diff_max']:10.2e} {wall:7.1f}",
                  flush=True)
    print("against the first row of each family; logp_check: the largest |Generator - Trainer| log-prob")
    save_rows(a.out, "parity.json", rows)
    return 1 if failed else 0


def result(run_dir: Path, torch) -> dict:
    """The final checkpoint's model, each version's policy loss and the log-prob check's maximum."""
    from ..engine.checkpoints import all_ckpts, read

    state = read(all_ckpts(run_dir / "ckpt")[-1])
    history = json.loads((run_dir / "summary.json").read_text())["history"]
    checks = [json.loads(line)["v"] for f in (run_dir / "metrics").glob("*.jsonl")
              for line in f.read_text().splitlines() if '"logp_diff_max"' in line]
    return {"model": {k: v.float() for k, v in state["model"].items()}, "losses": [h["loss_policy"] for h in history],
            "logp_diff_max": max(checks, default=float("nan"))}
