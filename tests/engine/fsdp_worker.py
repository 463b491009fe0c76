"""One rank of tests/engine/test_fsdp.py, run under torch.distributed.run (gloo, CPU).

Builds a tiny π0.5 (real PaliGemma + Gemma expert layers) with LoRA over a bf16 base twice, one
sharded with rlvla3's FSDP path and one whole, trains both one Adam step on the same rows (the sharded one on this rank's
half of them), once per compute dtype of the comma list it is given, and writes what the test
checks to <out>/<dtype>-rank<r>.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(out: Path, compute_dtypes: list[str]) -> None:
    dist.init_process_group("gloo")
    for compute_dtype in compute_dtypes:
        one_step(out, compute_dtype)
    dist.destroy_process_group()


def one_step(out: Path, compute_dtype: str) -> None:
    from rlvla3.cluster.compose import compose
    from rlvla3.engine import fsdp
    from rlvla3.policies import make_policy
    from rlvla3.policies.base import zero_batch
    from rlvla3.policies.lora import apply_lora
    from rlvla3.world import spec

    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = compose(["+experiment=libero_pi05", "policy.device=cpu", "env.image_size=32"])
    sp = spec(cfg)
    device = torch.device("cpu")
    whole, sharded = make_policy(cfg, sp), make_policy(cfg, sp)
    for model in (whole, sharded):   # a bf16 base beside float32 adapters, as a LoRA run of a release
        torch.manual_seed(7)
        apply_lora(model, 4, 16.0, "bfloat16")
    fsdp.shard(sharded, device, compute_dtype)

    # Rows that differ from one another, the same on every rank (seeded).
    g = torch.Generator().manual_seed(1)
    images, proprio, tokens, sample = zero_batch(sp, 4, "cpu")
    images = torch.randint(0, 255, images.shape, generator=g, dtype=torch.uint8)
    proprio = torch.randn(proprio.shape, generator=g)
    sample = torch.randn(sample.shape, generator=g) * 0.3
    rows = (images, proprio, tokens, sample)

    def step(model, parts) -> float:
        """One Adam step on the gradients summed over `parts` (each part's forward and backward
        on its own: a bf16 base's matmuls round differently for different row counts)."""
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3, eps=1e-5)
        for part in parts:
            with fsdp.autocast(device, compute_dtype if model is sharded else "float32"):
                logp, _, value = model.evaluate(*part)
            loss = -(logp.float().sum() * 1e-3) + value.float().pow(2).sum()
            loss.backward()
        opt.step()
        return opt

    split = [tuple(t[r::world] for t in rows) for r in range(world)]
    step(whole, split)
    mine = split[rank]   # this rank's rows; FSDP sums the gradients over ranks
    opt = step(sharded, [mine])

    grads_fp32 = all(p.grad.dtype == torch.float32 for p in sharded.parameters() if p.grad is not None)

    # Round trips through a sharded checkpoint (each rank writes its shards): read whole, as an
    # evaluation reads it, against the whole model; loaded into a fresh sharded replica.
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    from rlvla3.engine import sharded_checkpoints

    group = dist.new_group(backend="gloo")
    folder = out / f"{compute_dtype}.dcp"
    sharded_checkpoints.save({"model": sharded.state_dict(), "optimizer": get_optimizer_state_dict(sharded, opt),
                              "version": 1}, folder, group, leader=rank == 0)
    dist.barrier()
    state = sharded_checkpoints.read_whole(folder)   # as checkpoints.read reads a folder (without its trainer.pt)
    diff = max(float((state["model"][k] - v.detach()).abs().max()) for k, v in whole.state_dict().items())
    missing = sorted(set(whole.state_dict()) - set(state["model"]))
    unexpected = sorted(set(state["model"]) - set(whole.state_dict()))
    twin = make_policy(cfg, sp)
    apply_lora(twin, 4, 16.0, "bfloat16")
    fsdp.shard(twin, device, compute_dtype)
    twin_opt = torch.optim.Adam([p for p in twin.parameters() if p.requires_grad], lr=1e-3, eps=1e-5)
    parts = {"model": twin.state_dict(), "optimizer": get_optimizer_state_dict(twin, twin_opt)}
    sharded_checkpoints.load_into(folder, parts, group)
    set_optimizer_state_dict(twin, twin_opt, parts["optimizer"])
    round_trip = max(float((a.to_local() - b.to_local()).abs().max()) if a.to_local().numel() else 0.0
                     for a, b in zip(twin.state_dict().values(), sharded.state_dict().values()) if fsdp.is_sharded(a))
    moments = [(twin_opt.state[a]["exp_avg"].to_local(), opt.state[b]["exp_avg"].to_local())
               for a, b in zip(twin.parameters(), sharded.parameters()) if b in opt.state]
    opt_round_trip = max(float((x - y).abs().max()) if x.numel() else 0.0 for x, y in moments)

    # Each rank its own number of forwards on the gathered model: no collective inside.
    with torch.no_grad(), fsdp.autocast(device, compute_dtype):
        with fsdp.gathered(sharded):
            for _ in range(1 + 2 * rank):
                sharded.evaluate(*mine)
        sharded.evaluate(*mine)   # and collectives still pair up after it
    masters = sorted({str(p.dtype) for p in sharded.parameters() if p.requires_grad})   # what Adam steps

    (out / f"{compute_dtype}-rank{rank}.json").write_text(json.dumps({
        "max_param_diff": diff, "grads_fp32": grads_fp32,
        "missing": missing, "unexpected": unexpected, "round_trip": round_trip, "opt_round_trip": opt_round_trip,
        "moments": len(moments), "masters": masters}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(","))
