"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for the torch families: policy.data_parallel=fsdp.

Each Trainer rank keeps 1/N of every parameter, gradient and Adam moment (float32 master
shards). A family's `shard_units()` (its transformer layers) are gathered one at a time just
before their forward and freed after it; what no unit holds (embeddings, heads, norms) is the
root's, gathered for the whole `evaluate`. Gradients are reduce-scattered during backward, unit
by unit, as each one's gradient is ready (the reduction overlaps the rest of backward).

Mixed precision (policy.compute_dtype=bfloat16): parameters are gathered in bf16 and the forward
runs under autocast (the families build float32 tensors of their own, images and noise, that
meet bf16 weights); gradients are reduced in float32 and Adam steps the float32 shards. The
root does not cast its inputs: a stored denoising chain rounded to bf16 would no longer be the
sample whose log-probability the loss needs.

Every forward through a sharded model is a collective (each unit all-gathers): the Trainer runs
its training micro-batches in lockstep (a rank with fewer rows runs zero-weight ones), and
the π_prox forwards, whose count differs from rank to rank, run on a model gathered once
(`gathered`). gloo on CPU, NCCL on GPU.
"""
from __future__ import annotations

import contextlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def shard(policy, device: torch.device, compute_dtype: str) -> None:
    """Shard `policy` in place over the default process group (every Trainer rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)   # NCCL's buffers go to the current device: this rank's GPU
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # float32: each parameter computes in its own dtype (a LoRA base stays in
    # policy.lora_base_dtype, as on the Generators); bfloat16: everything is gathered in bf16.
    dtype = None if compute_dtype == "float32" else DTYPES[compute_dtype]
    for unit in policy.shard_units():
        fully_shard(unit, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32))
    fully_shard(policy, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                                                  cast_forward_inputs=False))
    # The Trainer calls `evaluate`, not `forward`: the root's parameters are gathered around it
    # (and around `act`, which a benchmark times on the same model).
    for method in ("evaluate", "act"):
        register_fsdp_forward_method(policy, method)
    for m in policy.modules():
        if isinstance(m, FSDPModule):
            # Gradients are summed, not averaged, over ranks: the learner divides by the number
            # of valid rows of the whole step, as it does with one rank. Sum-only collectives
            # because gloo has no pre-multiplied sum.
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)


def one_rank_group(device: torch.device) -> None:
    """A process group of this process alone (FSDP needs one), unless one exists."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)


def autocast(device: torch.device, compute_dtype: str):
    """The forward's autocast: matmuls in bf16 under policy.compute_dtype=bfloat16, else none."""
    if compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[compute_dtype])


def units(model) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model):
    """`model` whole on every rank for the duration (one all-gather per unit, collective): its
    forwards inside need no collective, so each rank runs as many as it needs."""
    all_units = units(model)
    for m in all_units:
        m.set_reshard_after_forward(False)
        m.unshard()
    try:
        yield model
    finally:
        for m in all_units:
            m.reshard()
            m.set_reshard_after_forward(True)


def is_sharded(t) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a parameter's shard (collective), a plain tensor as it is."""
    return t.full_tensor() if is_sharded(t) else t


def gather_state(model, skip: frozenset = frozenset(), keep: bool = True) -> dict[str, torch.Tensor]:
    """The state dict of `model` with whole tensors on the CPU, but for the keys in `skip`
    (collective: one all-gather per tensor, in state-dict order on every rank; keep=False:
    take part and keep nothing, as ranks that do not write do)."""
    out = {}
    for k, v in model.state_dict().items():
        if k in skip:
            continue
        whole = full(v.detach())
        if keep:
            out[k] = whole.cpu()
    return out


def load_state(model, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Each rank copies its shard of the whole tensors in `state` (no communication); returns
    (missing, unexpected) keys as `load_state_dict(strict=False)` does."""
    own = model.state_dict()
    with torch.no_grad():
        for k, v in state.items():
            if k in own:
                mine = own[k]
                (mine.to_local() if is_sharded(mine) else mine).copy_(shard_like(v, mine))
    return [k for k in own if k not in state], [k for k in state if k not in own]


def shard_like(whole: torch.Tensor, like):
    """This rank's part of `whole` as `like` (a parameter's shard) holds it; `whole` itself when
    `like` is not sharded."""
    if not is_sharded(like):
        return whole
    from torch.distributed.tensor import distribute_tensor

    # src_data_rank=None: every rank has `whole` and cuts its own part (no scatter).
    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements, src_data_rank=None).to_local()


def copy_model(dst, src) -> None:
    """dst's parameters and buffers <- src's, shard by shard (both sharded the same way)."""
    with torch.no_grad():
        for a, b in zip(dst.state_dict().values(), src.state_dict().values(), strict=True):
            a.copy_(b)


def optimizer_state(model, opt, keep: bool) -> dict | None:
    """Adam's state with whole tensors keyed by parameter name (collective; None where not kept)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    state = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if keep else None


def load_optimizer_state(model, opt, state: dict) -> None:
    """Adam's state as `optimizer_state` wrote it (whole tensors, by parameter name): each rank
    takes its shards (no communication)."""
    from torch.distributed.tensor import DTensor

    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for g in opt.param_groups for p in g["params"]]
    per_param = {}
    for i, p in enumerate(params):
        saved = state["state"].get(names[id(p)])
        if saved is not None:
            per_param[i] = {k: (DTensor.from_local(shard_like(v, p), p.device_mesh, p.placements,
                                                   shape=p.shape, stride=p.stride())
                                if torch.is_tensor(v) and v.dim() > 0 and is_sharded(p) else v)
                            for k, v in saved.items()}
    native = opt.state_dict()["param_groups"]
    groups = [{**saved, "params": mine["params"]} for saved, mine in zip(state["param_groups"], native, strict=True)]
    opt.load_state_dict({"state": per_param, "param_groups": groups})
