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
the π_prox forwards, whose count differs from rank to rank, run on the policy gathered once with
π_prox's values swapped into its shards (`ProxShards`: π_prox is a copy of what trains, never a
second model). gloo on CPU, NCCL on GPU.

Checkpoints are sharded too: each rank writes the shards it holds (sharded_checkpoints.py).
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


def copy_model(dst, src) -> None:
    """dst's parameters and buffers <- src's, shard by shard (both sharded the same way)."""
    with torch.no_grad():
        for a, b in zip(dst.state_dict().values(), src.state_dict().values(), strict=True):
            a.copy_(b)


class ProxShards:
    """π_prox of a sharded policy: this rank's shards of what trains at the rollout step's start,
    not a second model. A LoRA run's frozen base is never copied (a whole twin cost a second base
    per rank: 15 GB at OpenVLA-7B in bf16 on one GPU); a full fine-tuning keeps the same bytes
    as a twin would.

    Its forwards run on the policy itself: `whole()` swaps these values into the policy's shards,
    gathers the policy whole (its forwards then need no collective, so each rank runs as many as
    it needs) and swaps the policy's own values back after. `evaluate` outside `whole()` would
    run the current weights and is refused."""

    def __init__(self, policy):
        self.policy = policy
        self.values = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
        self.active = False

    def refresh(self) -> None:
        """The policy's current values become π_prox's (a new rollout step)."""
        params = dict(self.policy.named_parameters())
        with torch.no_grad():
            for n, v in self.values.items():
                v.copy_(params[n].detach())

    def state_dict(self) -> dict:
        return dict(self.values)

    def tensors(self) -> list:
        """The values in the order of the policy's trainable parameters (what Generators load)."""
        return list(self.values.values())

    def _swap(self) -> None:
        params = dict(self.policy.named_parameters())
        with torch.no_grad():
            for n, v in self.values.items():
                mine = params[n].detach()
                held = mine.clone()   # one tensor at a time: the swap's only extra memory
                mine.copy_(v)
                v.copy_(held)

    @contextlib.contextmanager
    def whole(self):
        """The policy gathered whole with π_prox's values (collective), in eval mode as the
        Generators run it (a module's training mode can take another kernel: the log-prob
        check then differs in its last bits)."""
        training = self.policy.training
        self._swap()
        try:
            with gathered(self.policy):
                self.policy.eval()
                self.active = True
                yield self
        finally:
            self.active = False
            self.policy.train(training)
            self._swap()

    def evaluate(self, *args, **kwargs):
        if not self.active:
            raise RuntimeError("π_prox's values are in the sharded policy only inside ProxShards.whole()")
        return self.policy.evaluate(*args, **kwargs)
