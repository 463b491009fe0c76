"""`python -m rlvla3.bench memory`: one Trainer GPU's memory for each family at its published
size, LoRA and full fine-tuning, over 1, 2, 4 and 8 GPUs of 80 and 141 GB, as rlvla3 trains them
there (policy.data_parallel=fsdp, compute_dtype=bfloat16, checkpointing as the preset sets it),
measured on the meta device (footprint.py: no weights read, nothing allocated; seconds per
family and mode on a CPU).

Each family runs as its committed LIBERO preset sets it up (conf/experiment/libero_<family>.yaml:
224 x 224 images, openvla one camera and the others two, OFT chunks of 8, π0/π0.5 chunks of 50
with 10 denoising steps); async PPO keeps one π_prox replica (`--copies`). Per row: the largest
micro-batch within 90% of the GPU (0: none fits), the peak at that micro-batch (at 1 when none
fits), and a checkpoint's size (what trains and its Adam state: a LoRA run's leaves the frozen
base out).
"""
from __future__ import annotations

from ..cluster.compose import compose
from ..policies.registry import PUBLISHED
from .common import chosen_families, save_rows

GPU_GB = (80, 141)
GPUS = (1, 2, 4, 8)
PUBLISHED_RUNS = {name: [f"+experiment=libero_{name}"] for name in PUBLISHED}   # each family's LIBERO preset
MODES = {"lora": ["policy.lora_rank=32"], "full": ["policy.lora_rank=0"]}


def run(a) -> int:
    """The table of the families of --families (of PUBLISHED_RUNS)."""
    from ..world import spec
    from . import footprint

    gb = footprint.GB
    print(f"{'family':12s} {'mode':5s} {'gpus':>4s} {'gpu_gb':>6s} {'micro_batch':>11s} {'peak_gb':>8s} {'ckpt_gb':>8s}")
    rows = []
    for name in chosen_families(a.families, PUBLISHED_RUNS):
        for mode, over in MODES.items():
            cfg = compose([*PUBLISHED_RUNS[name], *over, "policy.data_parallel=fsdp", "policy.compute_dtype=bfloat16",
                           *a.overrides])
            f = footprint.sharded_footprint(cfg, spec(cfg), a.copies)
            for gpus in GPUS:
                for cap in GPU_GB:
                    mb = f.largest_micro_batch(gpus, cap * gb)
                    peak = f.peak(gpus, max(mb, 1)) / gb
                    rows.append({"family": name, "mode": mode, "gpus": gpus, "gpu_gb": cap, "micro_batch": mb,
                                 "peak_gb": peak, "ckpt_gb": f.ckpt / gb, "trainable": f.trainable, "frozen": f.frozen,
                                 "sharded_gb": f.sharded / gb, "gathered_gb": f.gathered / gb,
                                 "prox_whole_gb": f.prox_whole / gb, "act_mb1_gb": f.activations / gb,
                                 "act_per_row_gb": f.per_row / gb})
                    print(f"{name:12s} {mode:5s} {gpus:4d} {cap:6d} {mb:11d} {peak:8.1f} {f.ckpt / gb:8.2f}", flush=True)
    print("GB = 1e9 bytes; micro_batch: the largest within 90% of the GPU (0: none fits; peak_gb then at 1)")
    save_rows(a.out, "memory.json", rows)
    return 0
