"""`python -m rlvla3.bench memory`: the Trainer's GPU memory for each family at its published
size, in each training configuration, measured on the meta device (footprint.py: no
weights read, nothing allocated; a few seconds per row on a CPU), and the largest micro-batch
that fits an 80 GB and a 141 GB GPU with a 10% margin.

Each family runs as its committed LIBERO preset sets it up (conf/experiment/libero_<family>.yaml:
224 x 224 images, openvla one camera and the others two, OFT chunks of 8, π0/π0.5 chunks of 50
with 10 denoising steps); async PPO keeps one π_prox copy of the trainable weights (`--copies`).
The "preset" column is the footprint at the preset's own micro-batch.
"""
from __future__ import annotations

from ..cluster.compose import compose
from ..policies.registry import PUBLISHED
from .common import chosen_families, save_rows

GPUS = {"80GB": 80e9, "141GB": 141e9}
PUBLISHED_RUNS = {name: [f"+experiment=libero_{name}"] for name in PUBLISHED}   # each family's LIBERO preset
CONFIGS = {   # label -> overrides
    "full": ["policy.lora_rank=0", "policy.grad_checkpointing=false"],
    "full+ckpt": ["policy.lora_rank=0", "policy.grad_checkpointing=true"],
    "lora32": ["policy.lora_rank=32", "policy.grad_checkpointing=false"],
    "lora32+ckpt (default)": ["policy.lora_rank=32", "policy.grad_checkpointing=true"],
}


def run(a) -> int:
    """The table of the families of --families (of PUBLISHED_RUNS)."""
    from ..world import spec
    from . import footprint

    gb = footprint.GB
    print(f"{'family':12s} {'config':22s} {'trainable':>10s} {'frozen':>8s} {'weights':>8s} {'grad+adam':>9s} {'copies':>7s} "
          f"{'act/row':>8s} {'@mb1':>7s} {'preset':>12s} " + " ".join(f"{'mb@' + g:>9s}" for g in GPUS))
    rows = []
    for name in chosen_families(a.families, PUBLISHED_RUNS):
        for label, over in CONFIGS.items():
            cfg = compose([*PUBLISHED_RUNS[name], *over, *a.overrides])
            one, per_row = footprint.fitted(cfg, spec(cfg), a.copies)
            ckpt = cfg.policy.grad_checkpointing
            fits = {g: footprint.largest_micro_batch(one, per_row, ckpt, cap) for g, cap in GPUS.items()}
            row = {"family": name, "config": label, "trainable": one.trainable, "frozen": one.frozen,
                   "weights_gb": one.weights / gb, "grads_adam_gb": (one.grads + one.adam) / gb,
                   "copies_gb": one.copies / gb, "act_per_row_gb": per_row / gb, "total_mb1_gb": one.total(ckpt) / gb,
                   "preset_micro_batch": cfg.algo.micro_batch,
                   "total_preset_gb": (one.total(ckpt) + (cfg.algo.micro_batch - 1) * per_row) / gb,
                   **{f"micro_batch_{g}": v for g, v in fits.items()}}
            rows.append(row)
            preset = f"{row['total_preset_gb']:6.1f}@mb{cfg.algo.micro_batch:<3d}"
            print(f"{name:12s} {label:22s} {one.trainable / 1e9:9.3f}B {one.frozen / 1e9:7.2f}B {row['weights_gb']:8.1f} "
                  f"{row['grads_adam_gb']:9.1f} {row['copies_gb']:7.1f} {row['act_per_row_gb']:8.2f} "
                  f"{row['total_mb1_gb']:7.1f} {preset} " + " ".join(f"{fits[g]:9d}" for g in GPUS), flush=True)
    print("GB = 1e9 bytes; mb@N: the largest micro-batch within 90% of an N GPU (0: does not fit)")
    save_rows(a.out, "memory.json", rows)
    return 0
