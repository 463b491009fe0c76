"""The Megatron LM's self-checks, run as MPI jobs (tests/policies/test_megatron.py, bench/gpu_vla.sh):

    mpiexec -n TP python -m rlvla3.tools.megatron_check          CPU: transformers vs Megatron, TP ranks
    python -m rlvla3.tools.megatron_check --gpu                  GPU: Megatron's DDP + optimizer, TP = 1
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..engine.megatron_lm import (
    MegatronLlama,
    build_gpt,
    full_logits,
    gather_hf,
    gather_named,
    hf_to_mcore,
    hidden_states,
    init_parallel,
    local_state,
)


def check(steps: int = 2) -> dict:
    """Run under `mpiexec -n TP python -m rlvla3.tools.megatron_check`: a tiny transformers Llama (grouped-
    query attention, padding in the batch) and its Megatron copy split over TP ranks must give the
    same logits, the same gradients (converted back to the transformers layout) and, after
    `steps` Adam steps each (torch Adam on the local shards), the same weights."""
    import json
    import socket

    import torch.distributed as dist
    from mpi4py import MPI
    from transformers import LlamaConfig, LlamaForCausalLM

    comm = MPI.COMM_WORLD
    rank, tp = comm.rank, comm.size
    torch.set_num_threads(1)
    if rank == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
    else:
        port = None
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=tp)
    init_parallel(tp)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg)
    lm = MegatronLlama(cfg, tp)
    lm.gpt.load_state_dict(hf_to_mcore(hf.state_dict(), cfg, tp, rank), strict=False)
    ids = torch.randint(0, cfg.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 3:6] = 0                      # padding inside the sequence, as the VLA prefix has
    labels = torch.roll(ids, -1, 1)
    opt_hf = torch.optim.Adam(hf.parameters(), lr=1e-3)
    opt_mc = torch.optim.Adam([p for p in lm.gpt.parameters()], lr=1e-3)
    pos = torch.arange(12).expand(3, -1)
    out = {"tp": tp}
    for step in range(steps):
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = full_logits(lm.gpt, lm.model(inputs_embeds=lm.get_input_embeddings()(ids), attention_mask=mask).last_hidden_state)
        for logits, opt in ((ref, opt_hf), (got, opt_mc)):
            opt.zero_grad()
            F.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.reshape(-1), reduction="none").mul(mask.reshape(-1)).sum().backward()
        grads = {k: p.grad for k, p in lm.gpt.named_parameters()}
        grads_hf = gather_named(grads, cfg)
        if step == 0:
            out["logit_diff"] = float((ref - got).detach().abs().max())
            out["grad_rel_diff"] = max(float((grads_hf[k] - p.grad).norm() / p.grad.norm().clamp(min=1e-12))
                                       for k, p in hf.named_parameters())
        opt_hf.step()
        opt_mc.step()
    back = gather_hf(lm.gpt, cfg)
    out["weight_diff_after_steps"] = max(float((back[k] - v).abs().max()) for k, v in hf.state_dict().items())
    if rank == 0:
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    return out


def check_gpu(steps: int = 3) -> dict:
    """One GPU, TP = PP = 1, Megatron's own stack: DDP wrapper with its contiguous grad buffer and
    Megatron's optimizer (get_megatron_optimizer, Adam, grad clipping). The transformers model
    trained with torch Adam and the same clipping must end at the same weights."""
    import json
    import os

    import torch.distributed as dist
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from transformers import LlamaConfig, LlamaForCausalLM

    if not torch.cuda.is_available():
        raise RuntimeError("check_gpu needs a CUDA device (torch.cuda.is_available() is False)")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    init_parallel(1)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=128, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = LlamaForCausalLM(cfg).cuda()
    gpt = build_gpt(cfg, 1).cuda()
    gpt.load_state_dict({k: v.cuda() for k, v in hf_to_mcore(hf.state_dict(), cfg, 1, 0).items()}, strict=False)
    ddp = DistributedDataParallel(gpt.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), gpt)
    opt_mc = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=1.0, bf16=False, fp16=False,
                                                    params_dtype=torch.float32, use_distributed_optimizer=False), [ddp])
    opt_hf = torch.optim.Adam(hf.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (4, 32), generator=g).cuda()
    mask = torch.ones_like(ids)
    mask[1, 5:9] = 0
    labels = torch.roll(ids, -1, 1)
    out = {"device": torch.cuda.get_device_name(0), "steps": steps}

    def loss_of(logits):
        per_token = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), labels.reshape(-1), reduction="none")
        return per_token.mul(mask.reshape(-1)).sum() / mask.sum()

    for step in range(steps):
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=torch.arange(32, device="cuda").expand(4, -1)).logits
        got = full_logits(gpt, hidden_states(gpt, gpt.embedding.word_embeddings(ids), mask))
        if step == 0:
            out["logit_diff"] = float((ref - got).detach().abs().max())
        opt_hf.zero_grad()
        loss_hf = loss_of(ref)
        loss_hf.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt_hf.step()
        ddp.zero_grad_buffer()
        opt_mc.zero_grad()
        loss_mc = loss_of(got)
        loss_mc.backward()
        ddp.finish_grad_sync()
        ok, grad_norm, _ = opt_mc.step()
        out.setdefault("loss", []).append([float(loss_hf), float(loss_mc)])
        out.setdefault("grad_norm", []).append(float(grad_norm))
    back = gather_named(local_state(gpt), cfg)
    out["weight_diff_after_steps"] = max(float((back[k] - v).abs().max()) for k, v in hf.state_dict().items())
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    import sys

    check_gpu() if "--gpu" in sys.argv else check()
