"""The Trainer's compute half for torch policies: shard rows, advantages (algo.name: GAE for ppo,
group-normalised outcomes for grpo, successes only for raft, V-trace for vtrace), the clipped
(decoupled) PPO step, data parallelism (policy.data_parallel: one all-reduce of the gradients, or
FSDP2 in fsdp.py), π_prox, the reference policy of the KL term, and the model/optimizer part of
checkpoints.

The interface it shares with the emulated learner is in learners.py.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import socket
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch

from ..algo import ALGORITHMS, SegmentError, decoupled_ppo_loss, lr_at, vtrace
from ..policies import make_policy
from ..policies.base import flat_params, pick_device, zero_batch
from ..policies.lora import peft_names, trainable
from . import checkpoints, fsdp, sharded_checkpoints, shards
from .checkpoints import CheckpointError, load_torch
from .learners import STAT_KEYS, TERM_KEYS
from .protocol import GroupAddress, Slice, Tag

LOST_VERSION = -1   # the label of rows whose producing weights a rollback lost: older than any live version
ROW_KEYS = ("images", "proprio", "tokens", "sample", "valid", "logp_behav", "logp_prox", "adv", "ret")


@dataclass
class Rows:
    """A loaded shard, flattened to rows (row = t * n_envs + env), ready for training."""

    images: torch.Tensor
    proprio: torch.Tensor
    tokens: torch.Tensor
    sample: torch.Tensor      # what the policy sampled (token ids or denoising chain)
    valid: torch.Tensor       # float 1/0: the row is a decision (grpo: 0 after an episode ended)
    logp_behav: torch.Tensor
    logp_prox: torch.Tensor   # NaN until computed; [n] or, with algo.ratio=token, per action coordinate [n, K*D]
    adv: torch.Tensor
    ret: torch.Tensor
    versions: torch.Tensor
    segment: dict             # time-major arrays V-trace recomputes from each version (else empty)
    adv_version: int = -1     # vtrace: the version whose π_prox the advantages use


def flat(x: np.ndarray) -> torch.Tensor:
    """[T, N, ...] -> rows [T*N, ...]."""
    return torch.from_numpy(np.ascontiguousarray(x.reshape(-1, *x.shape[2:])))


def load_rows(path: Path, algo, evaluate: bool = False) -> Rows:
    """Read a shard and compute its advantages and returns (vtrace: later, per version;
    evaluation: none, the rows are only counted)."""
    a, attrs = shards.read_shard(path)
    if evaluate:   # an evaluation run of a grpo config resets from per-env seeds: no groups to check
        adv = ret = np.zeros_like(a["values"])
        segment = {}
    else:
        try:
            adv, ret, segment = ALGORITHMS[algo.name].segment(a, attrs, path.name, algo)
        except SegmentError as e:
            # A ShardError: the shard is quarantined and trained as absent (an env child restarted
            # mid-reset used to make this fatal on every resume), and the warning says why.
            raise shards.ShardError(str(e)) from None
    lb, sample = flat(a["logprobs"]), flat(a["sample"])
    # Token ratios: one log-prob per action coordinate of the chunk (K*D: a token family's tokens).
    prox_shape = (len(lb), int(np.prod(a["actions"].shape[2:]))) if algo.ratio == "token" else lb.shape
    return Rows(flat(a["images"]), flat(a["proprio"]), flat(a["tokens"]), sample,
                flat(a["valid"]).float(), lb, torch.full(prox_shape, float("nan")), flat(adv), flat(ret),
                flat(a["versions"]), segment)


def frozen_keys(policy) -> list[str]:
    """The state-dict keys of the parameters that never train (a LoRA run's base; none without
    LoRA, and then a checkpoint holds every weight)."""
    return [k for k, v in policy.state_dict(keep_vars=True).items()
            if isinstance(v, torch.nn.Parameter) and not v.requires_grad]


def frozen_fingerprint(policy, keys: list[str]) -> int:
    """crc32 over at most 4096 evenly strided values of each named tensor (cheap at 7B: read per
    checkpoint and per load; a different base differs almost everywhere)."""
    sd, crc = policy.state_dict(), 0
    for k in keys:
        t = sd[k].detach().reshape(-1)
        crc = zlib.crc32(t[::max(1, t.numel() >> 12)].float().cpu().numpy().tobytes(), crc)
    return crc


def base_of(cfg) -> str:
    """Where a run's frozen weights come from, in words a user can act on."""
    p = cfg.policy
    if p.pretrained:
        return f"policy.pretrained={p.pretrained}"
    if p.init_from:
        return f"policy.init_from={p.init_from}"
    return f"a random initialisation (policy.name={p.name}, seed={cfg.seed})"


def check_base(frozen: dict, mine: int | None, source: str) -> None:
    """A checkpoint that holds only what trains (its `frozen` record) was trained on one base:
    refused over another (`mine`: this policy's base fingerprint, None if it lacks those keys)."""
    if mine != frozen["fingerprint"]:
        raise CheckpointError(f"{source} holds only the weights that train; they were trained on "
                              f"{frozen['base']} ({len(frozen['keys'])} frozen tensors), and this policy's frozen "
                              "weights are not those: build it on that base (the run's config.yaml names it)")


def load_model(policy, model: dict, frozen: dict | None, source: str, keep_own: frozenset = frozenset(),
               base_fp: int | None = None) -> None:
    """Load a checkpoint's weights: every one of them (frozen None), or, from a checkpoint that
    holds only what trains, all but its frozen base, which must be this policy's own (same names,
    same fingerprint; `base_fp` gives it where known: a sharded policy's is not on one rank).
    Keys in `keep_own` keep this policy's values."""
    allowed = set(keep_own)
    if frozen is not None:
        keys = list(frozen["keys"])
        mine = None
        if set(keys) <= set(policy.state_dict()):
            mine = base_fp if base_fp is not None else frozen_fingerprint(policy, keys)
        check_base(frozen, mine, source)
        allowed |= set(keys)
    todo = {k: v for k, v in peft_names(model).items() if k not in keep_own}
    missing, unexpected = policy.load_state_dict(todo, strict=False)
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"missing keys {sorted(set(missing) - allowed)}, unexpected keys {sorted(unexpected)}")


def load_init(policy, path: str) -> None:
    """Start from the model weights of a checkpoint (policy.init_from), strictly: a checkpoint of
    another family or size is refused, naming what differs. Parameters an SFT checkpoint says SFT
    never trained keep this run's initialisation."""
    p = Path(path)
    if not checkpoints.exists(p):
        raise FileNotFoundError(f"policy.init_from={path}: no such checkpoint (a run's ckpt/v*.pt or ckpt/v*.dcp, "
                                f"or the output of python -m rlvla3.sft)")
    state = checkpoints.read(p)
    model = state.get("model", state)
    # An SFT checkpoint names what its loss never trained (tools/sft.py: the value head, the flow
    # noise std): this run's config sets those, as if no checkpoint held them.
    keep_own = frozenset(state.get("sft", {}).get("untrained", ()))
    try:
        load_model(policy, model, state.get("frozen"), f"policy.init_from={path}", keep_own)
    except CheckpointError:
        raise   # says itself what the checkpoint needs
    except RuntimeError as e:
        raise RuntimeError(f"policy.init_from={path} does not fit this policy (policy.name and sizes must match "
                           f"the run that wrote it): {str(e)[:600]}") from e


class TorchLearner:
    def __init__(self, cfg, world, spec, metrics, n_trainers: int, index: int, shards_dir: Path):
        self.cfg, self.spec, self.metrics, self.n, self.index = cfg, spec, metrics, n_trainers, index
        self.shards_dir = shards_dir
        self.device = pick_device(cfg.policy.device)
        # lm_backend=megatron: groups of `tp` consecutive Trainer ranks hold one model replica
        # (its LM split over them) and train the same rows; the replicas are data parallel.
        self.megatron = cfg.policy.lm_backend == "megatron"
        self.tp = cfg.policy.tensor_parallel if self.megatron else 1
        self.dp_size, self.dp_index = n_trainers // self.tp, index // self.tp
        # data_parallel=fsdp: each rank holds 1/N of every weight (fsdp.py), sharded in connect().
        self.fsdp = cfg.policy.data_parallel == "fsdp"
        # weights() and state() gather the model's shards: every Trainer rank calls them together.
        self.collective = self.megatron or (self.fsdp and n_trainers > 1)
        # data_parallel=fsdp: every rank writes its shards of a checkpoint (sharded_checkpoints.py).
        self.sharded_ckpts = self.fsdp
        self.policy = make_policy(cfg, spec).to(self.device)
        if cfg.policy.init_from:
            load_init(self.policy, cfg.policy.init_from)
        # A LoRA run's base never changes: checkpoints leave it out, naming it (a checkpoint's
        # `frozen`: these keys, a fingerprint of their values, the base in words); Megatron's
        # checkpoints keep every weight.
        self.frozen_keys = [] if self.megatron else frozen_keys(self.policy)
        self.base = base_of(cfg)
        # Read before any sharding (a sharded base is not on one rank); the base never changes.
        self.base_fp = frozen_fingerprint(self.policy, self.frozen_keys) if self.frozen_keys else None
        self.export_names = [name for name, _ in self.policy.named_parameters()]   # what Generators load
        self.loaded: dict[str, Rows] = {}
        self.bad: set[str] = set()
        self.lost_above: dict[str, int] = {}   # shard -> the version a resume rolled back to (mark_lost)
        self.version = 0   # the version being trained (set by each `train`)
        self.total_opt_steps = cfg.algo.max_versions * world.opt_steps_per_version   # the lr schedule's length
        self.prox = self.ref = None
        self.lm_config, self.tp_rank = None, 0   # Megatron: set when connect() swaps the LM in
        self.ckpt_group = None                   # FSDP: the sharded checkpoints' process group (connect)
        self._full_cache = None                  # Megatron: the gathered state until the next step
        if not (self.megatron or self.fsdp):   # after connect(), on the swapped-in LM or the shards
            self._setup_optimizer()

    def _setup_optimizer(self) -> None:
        # Only what trains has gradients and Adam state (policy.lora_rank > 0: adapters and heads).
        self.params = trainable(self.policy)
        self.opt = torch.optim.Adam(self.params, lr=self.cfg.algo.lr, eps=1e-5)
        # A Trainer may own no rows of an optimizer step; it still all-reduces (zero) gradients.
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.prox = self._snapshot()
        # The KL term's reference: the initial (or pretrained) weights, frozen.
        self.ref = self._clone() if self.cfg.algo.kl_coef > 0 else None

    # ------------------------------------------------------------ setup
    def connect(self, transport, train_ranks: list[int]) -> None:
        """Process group over the Trainer ranks (Trainer 0 picks a port and tells the rest): data
        parallel, and with lm_backend=megatron also Megatron's tensor-parallel groups; FSDP shards
        the model over it (one rank included: the same path)."""
        if self.n == 1 and not (self.megatron or self.fsdp):
            return
        import torch.distributed as dist

        if self.index == 0:
            s = socket.socket()
            s.bind(("", 0))
            addr = (socket.gethostname(), s.getsockname()[1])
            s.close()
            for r in train_ranks[1:]:
                transport.send(r, Tag.GROUP_ADDRESS, GroupAddress(*addr))
        else:
            got = transport.recv(train_ranks[0], Tag.GROUP_ADDRESS, self.cfg.runtime.startup_timeout, "process-group address")
            addr = (got.host, got.port)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{addr[0]}:{addr[1]}", rank=self.index,
                                # Trainers finish building their models at different times (a
                                # pretrained VLA takes minutes): the rendezvous gets the start-up
                                # bound, not the liveness one. A dead peer is still named within
                                # runtime.liveness_timeout by the MPI heartbeats.
                                world_size=self.n, timeout=timedelta(seconds=self.cfg.runtime.startup_timeout))
        if self.megatron:
            self._to_megatron()
        elif self.fsdp:
            fsdp.shard(self.policy, self.device, self.cfg.policy.compute_dtype)
            self._setup_optimizer()
            # Each rank writes its shards of a checkpoint on a thread of its own (checkpoints.Saver):
            # its collectives get a group of their own, never met by the training's on the default
            # group; gloo, as the shards it writes are host copies.
            self.ckpt_group = dist.new_group(backend="gloo")

    def _to_megatron(self) -> None:
        """Swap the policy's transformers LM for its Megatron copy (same weights, this rank's shard)."""
        from megatron.core import parallel_state

        from .megatron_lm import init_parallel

        init_parallel(self.tp, seed=self.cfg.policy.init_seed)
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        hf = self.policy.lm
        self.lm_config = hf.config
        self.policy.lm = self._megatron_lm(hf.state_dict())
        self._setup_optimizer()

    def _megatron_lm(self, hf_state: dict):
        from .megatron_lm import MegatronLlama, hf_to_mcore

        lm = MegatronLlama(self.lm_config, self.tp)
        lm.gpt.load_state_dict(hf_to_mcore(hf_state, self.lm_config, self.tp, self.tp_rank), strict=False)
        return lm.to(self.device)

    def _clone(self):
        """A frozen copy of the policy (for Megatron and FSDP a fresh replica: its modules hold
        process groups; FSDP's is built as the policy was and sharded the same way)."""
        if self.fsdp:
            twin = make_policy(self.cfg, self.spec).to(self.device)
            fsdp.shard(twin, self.device, self.cfg.policy.compute_dtype)
            fsdp.copy_model(twin, self.policy)
            return twin.eval()
        if not self.megatron:
            # Frozen weights (a LoRA base) never change: the copy shares them.
            frozen = {id(p): p for p in self.policy.parameters() if not p.requires_grad}
            return copy.deepcopy(self.policy, memo=frozen).eval()
        twin = make_policy(self.cfg, self.spec).to(self.device)
        twin.lm = self._megatron_lm(twin.lm.state_dict())
        twin.load_state_dict(self.policy.state_dict())
        return twin.eval()

    def _snapshot(self):
        """π_prox: the weights at the start of the rollout step (stale rows need it; so do V-trace
        and the log-prob check, which compare it with the behaviour policy)."""
        a = self.cfg.algo
        if not (self.cfg.mode.eta > 0 or ALGORITHMS[a.name].targets_per_version or a.check_logprobs):
            return None
        if self.prox is not None and self.megatron:
            self.prox.load_state_dict(self.policy.state_dict())   # reuse the replica
            return self.prox
        if self.fsdp:   # the shards of what trains, swapped in for its forwards (fsdp.ProxShards)
            if self.prox is None:
                return fsdp.ProxShards(self.policy)
            self.prox.refresh()
            return self.prox
        return self._clone()

    # ------------------------------------------------------------ data
    def preload(self, name: str) -> Rows | None:
        if name in self.loaded or name in self.bad:
            return self.loaded.get(name)
        path = self.shards_dir / name
        try:
            with self.metrics.timed("load_shard", shard=name):
                self.loaded[name] = load_rows(path, self.cfg.algo, self.cfg.runtime.evaluate)
                if name in self.lost_above:
                    v = self.loaded[name].versions
                    v[v > self.lost_above[name]] = LOST_VERSION
        except shards.ShardError as e:
            shards.quarantine(path, str(e))
            self.bad.add(name)
            self.metrics.scalar("bad_shards", len(self.bad))
            return None
        return self.loaded[name]

    def mark_lost(self, name: str, above: int) -> None:
        """A resume rolled back to version `above`: rows of shard `name` labelled with a later
        version came from weights no checkpoint holds (the resumed run will publish its own
        version `above + 1`, with the same number). They are relabelled stale, so π_prox is
        recomputed for them instead of taken from their behaviour log-prob."""
        self.lost_above[name] = above

    def forget(self, names) -> None:
        for name in names:
            self.loaded.pop(name, None)

    def new_version(self) -> None:
        self.prox = self._snapshot()

    # ------------------------------------------------------------ one optimizer step
    def train(self, slices: tuple[Slice, ...], version: int, opt_step: int = 1) -> np.ndarray:
        """One optimizer step (number `opt_step`, 1-based, of the whole run) over `slices`."""
        self.version = version
        self._full_cache = None   # the weights are about to change
        if self.cfg.runtime.evaluate:   # rows are counted, the weights never change
            sums = torch.zeros(1 + len(STAT_KEYS), dtype=torch.float64)
            sums[0] = sum(s.stop - s.start for s in slices if s.owner == self.dp_index)
            return np.array(self._allreduce_stats(sums))
        with self._prox_whole():
            batch = self._gather([s for s in slices if s.owner == self.dp_index])
        self.opt.zero_grad(set_to_none=False)
        sums = torch.zeros(1 + len(STAT_KEYS), dtype=torch.float64)
        if self.cfg.algo.norm_adv:
            self._normalize_adv(batch)
        if batch is not None:
            sums[0] = float(batch["valid"].sum())
            sums[-1] = float(batch.pop("stale").sum())
        mb_rows = self.cfg.algo.micro_batch
        mine = 0 if batch is None else math.ceil(batch["adv"].shape[0] / mb_rows)
        for i in range(self._lockstep(mine)):
            if i < mine:
                mb = {k: v[i * mb_rows:(i + 1) * mb_rows].to(self.device) for k, v in batch.items()}
            else:   # FSDP: every rank runs as many forwards as the busiest; this one weighs nothing
                mb = self._idle_micro_batch()
            with self._autocast():
                terms = self._loss(mb)
            terms.total.backward()
            if i < mine:
                sums[1:1 + len(TERM_KEYS)] += torch.tensor([float(getattr(terms, k)) for k in TERM_KEYS], dtype=torch.float64)
        # FSDP reduced the gradients during backward; only the statistics are left to sum.
        total = torch.tensor(self._allreduce_stats(sums), dtype=torch.float64) if self.fsdp else self._allreduce(sums)
        if total[0] > 0:
            for p in self.params:
                p.grad.div_(float(total[0]))
            if self.cfg.algo.max_grad_norm > 0:
                self._clip_grads(self.cfg.algo.max_grad_norm)
            self._set_lr(opt_step)
            self.opt.step()
        return total.numpy()

    def _lockstep(self, mine: int) -> int:
        """The micro-batches this rank runs: its own, or under FSDP (every forward and backward
        is a collective) as many as the rank with the most."""
        if not (self.fsdp and self.n > 1):
            return mine
        import torch.distributed as dist

        t = torch.tensor([mine], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _idle_micro_batch(self) -> dict[str, torch.Tensor]:
        """One row of zeros whose weight (valid) is 0: its loss and gradient are zero."""
        images, proprio, tokens, sample = zero_batch(self.spec, 1, self.device)
        zeros = torch.zeros(1, device=self.device)
        per_token = self.cfg.algo.ratio == "token"   # one log-prob per action coordinate
        prox = torch.zeros(1, self.spec.chunk * self.spec.action_dim, device=self.device) if per_token else zeros
        return {"images": images, "proprio": proprio, "tokens": tokens, "sample": sample, "valid": zeros,
                "logp_behav": zeros, "logp_prox": prox, "adv": zeros, "ret": zeros}

    def _autocast(self):
        return fsdp.autocast(self.device, self.cfg.policy.compute_dtype)

    def _prox_whole(self):
        """FSDP: π_prox gathered whole for the shard loading's forwards (their count differs from
        rank to rank: stale rows, the log-prob check), freed after; a no-op otherwise."""
        if self.fsdp and self.prox is not None and not self.cfg.runtime.evaluate:
            return self.prox.whole()
        return contextlib.nullcontext()

    def _set_lr(self, opt_step: int) -> None:
        a = self.cfg.algo
        if a.lr_warmup_steps == 0 and not a.lr_decay:
            return   # constant: the optimizer keeps the lr it was built with
        lr = lr_at(a.lr, opt_step, a.lr_warmup_steps, self.total_opt_steps, a.lr_decay)
        for group in self.opt.param_groups:
            group["lr"] = lr

    def _normalize_adv(self, batch: dict[str, torch.Tensor] | None) -> None:
        """A <- (A - mean) / std over the whole global batch (PPO's usual normalisation; it keeps
        the policy step size independent of the reward scale)."""
        adv = batch["adv"].double() if batch is not None else torch.zeros(0, dtype=torch.float64)
        m = batch["valid"].double() if batch is not None else torch.zeros(0, dtype=torch.float64)
        n, s, ss = self._allreduce_stats(torch.stack([m.sum(), (m * adv).sum(), (m * adv * adv).sum()]))
        if n < 2:
            return
        mean = s / n
        std = float(max(ss / n - mean * mean, 0.0)) ** 0.5
        if batch is not None:
            batch["adv"] = (m * (adv - mean) / (std + 1e-8)).float()

    def _clip_grads(self, max_norm: float) -> None:
        """Clip by the global gradient norm. With tensor parallelism a split parameter's squared
        norm is summed over its TP shards, a replicated one counted once: every TP rank then
        scales by the same factor and the replicated parameters stay identical."""
        params = self.params
        if self.tp == 1:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            return
        import torch.distributed as dist
        from megatron.core import parallel_state

        split = sum(float(p.grad.double().pow(2).sum()) for p in params if getattr(p, "tensor_model_parallel", False))
        whole = sum(float(p.grad.double().pow(2).sum()) for p in params if not getattr(p, "tensor_model_parallel", False))
        t = torch.tensor([split], dtype=torch.float64)
        dist.all_reduce(t, group=parallel_state.get_tensor_model_parallel_group())
        scale = max_norm / (float(t[0] + whole) ** 0.5 + 1e-6)
        if scale < 1.0:
            for p in params:
                p.grad.mul_(scale)

    def _dp_group(self):
        """The data-parallel group: all Trainers, or with Megatron the ranks holding the same shard."""
        if not self.megatron:
            return None
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_group()

    def _allreduce_stats(self, stats: torch.Tensor) -> list[float]:
        """Sum a few float64 statistics over the data-parallel Trainers (no gradients involved)."""
        if self.dp_size > 1:
            import torch.distributed as dist

            stats = stats.to(self.device)
            dist.all_reduce(stats, group=self._dp_group())
        return stats.cpu().tolist()

    def _gather(self, mine: list[Slice]) -> dict[str, torch.Tensor] | None:
        parts = []
        for s in mine:
            rows = self.preload(s.name)
            if rows is None:
                continue
            if ALGORITHMS[self.cfg.algo.name].targets_per_version:
                self._vtrace(rows)
            else:
                self._fill_prox(rows, s.start, s.stop)
            part = {k: getattr(rows, k)[s.start:s.stop] for k in ROW_KEYS}
            part["stale"] = part["valid"] * (rows.versions[s.start:s.stop] < self.version)
            parts.append(part)
        if not parts:
            return None
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}

    def _prox_eval(self, rows: Rows, idx: torch.Tensor, per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """log π_prox (per_token: of each action token) and V_prox of rows `idx` (no gradient),
        in micro-batches."""
        logps, values = [], []
        mb = self.cfg.algo.micro_batch
        with torch.no_grad(), self._autocast():
            for i in range(0, len(idx), mb):
                j = idx[i:i + mb]
                lp, _, v = self.prox.evaluate(*(getattr(rows, k)[j].to(self.device) for k in ("images", "proprio", "tokens", "sample")),
                                              per_token=per_token)
                logps.append(lp.float().cpu())
                values.append(v.float().cpu())
        return torch.cat(logps), torch.cat(values)

    def _fill_prox(self, rows: Rows, start: int, stop: int) -> None:
        """log π_prox for rows [start, stop): the behaviour log-prob for fresh rows (produced by
        this very version), the frozen step-start model for stale ones (computed once, cached).
        Token ratios need each token's log-prob, which the Generator does not store: every row's
        comes from the step-start model."""
        sl = slice(start, stop)
        if self.cfg.algo.ratio == "token":
            self._fill_token_prox(rows, start, stop)
            return
        todo = torch.isnan(rows.logp_prox[sl])
        if not todo.any():
            return
        fresh = rows.versions[sl] >= self.version
        if self.cfg.algo.check_logprobs:
            self._check_logprobs(rows, torch.nonzero(todo & fresh)[:, 0] + start)
        rows.logp_prox[sl] = torch.where(fresh, rows.logp_behav[sl], rows.logp_prox[sl])
        stale = torch.nonzero(todo & ~fresh)[:, 0] + start
        if len(stale):
            rows.logp_prox[stale] = self._prox_eval(rows, stale)[0]

    def _fill_token_prox(self, rows: Rows, start: int, stop: int) -> None:
        todo = torch.nonzero(torch.isnan(rows.logp_prox[start:stop, 0]))[:, 0] + start
        if not len(todo):
            return
        rows.logp_prox[todo] = self._prox_eval(rows, todo, per_token=True)[0]
        fresh = todo[rows.versions[todo] >= self.version]
        if self.cfg.algo.check_logprobs:   # the same forward serves the check
            self._check_logprobs(rows, fresh, rows.logp_prox[fresh].sum(-1))

    def _check_logprobs(self, rows: Rows, fresh: torch.Tensor, recomputed: torch.Tensor | None = None) -> None:
        """π_prox holds exactly the weights that produced fresh rows: their log-probs recomputed
        here (or given, when a π_prox forward already made them) must match the Generator's (a
        mismatch means the two sides disagree on the model, the sample, or the noise). Logged as
        scalar logp_diff_max."""
        if len(fresh):
            lp = self._prox_eval(rows, fresh)[0] if recomputed is None else recomputed
            diff = float((lp - rows.logp_behav[fresh]).abs().max())
            self.metrics.scalar("logp_diff_max", diff, rows=len(fresh), version=self.version)

    def _vtrace(self, rows: Rows) -> None:
        """V-trace advantages and value targets of the whole shard with π_prox as the target
        policy (recomputed once per version the shard is trained in). Rows produced by this very
        version need no forward: their π_prox is the behaviour policy and their V is stored."""
        if rows.adv_version == self.version:
            return
        seg = rows.segment
        T, N = seg["rewards"].shape
        stale = torch.nonzero(rows.versions < self.version)[:, 0]
        if self.cfg.algo.check_logprobs:
            self._check_logprobs(rows, torch.nonzero(rows.versions >= self.version)[:, 0])
        logp, values = rows.logp_behav.clone(), torch.from_numpy(seg["values"].reshape(-1).copy())
        if len(stale):
            logp[stale], values[stale] = self._prox_eval(rows, stale)
        a = self.cfg.algo
        log_rho = (logp - rows.logp_behav).numpy().reshape(T, N)
        vs, adv = vtrace(seg["rewards"], values.numpy().reshape(T, N), seg["terminated"], seg["truncated"],
                         seg["bootstrap"], log_rho, a.gamma, a.vtrace_rho_clip, a.vtrace_c_clip)
        rows.adv, rows.ret = flat(adv), flat(vs)
        # The off-policy correction is inside the V-trace advantages: the surrogate's ratio is
        # taken around π_prox with no further behaviour weight.
        rows.logp_prox = logp
        rows.adv_version = self.version

    def _loss(self, mb):
        a = self.cfg.algo
        logp, ent, value = self.policy.evaluate(mb["images"], mb["proprio"], mb["tokens"], mb["sample"],
                                                per_token=a.ratio == "token")
        # V-trace corrects for the behaviour policy in its targets: the loss anchors at π_prox alone.
        logp_behav = mb["logp_prox"] if ALGORITHMS[a.name].targets_per_version else mb["logp_behav"]
        logp_ref = None
        if self.ref is not None:
            with torch.no_grad():
                logp_ref, _, _ = self.ref.evaluate(mb["images"], mb["proprio"], mb["tokens"], mb["sample"])
        return decoupled_ppo_loss(logp, mb["logp_prox"], logp_behav, mb["adv"], value, mb["ret"], ent,
                                  a.clip, a.behaviour_clip, a.vf_coef, a.ent_coef, weight=mb["valid"],
                                  logp_ref=logp_ref, kl_coef=a.kl_coef)

    def _allreduce(self, sums: torch.Tensor) -> torch.Tensor:
        """Sum gradients and loss statistics over the data-parallel Trainers in one collective."""
        if self.dp_size == 1:
            return sums
        import torch.distributed as dist

        grads = [p.grad.reshape(-1) for p in self.params]
        buf = torch.cat([*grads, sums.to(grads[0].device, grads[0].dtype)])
        t0 = time.time()
        dist.all_reduce(buf, group=self._dp_group())
        self.metrics.span("comm", t0, time.time() - t0, what="allreduce", bytes=buf.numel() * buf.element_size())
        off = 0
        for p in self.params:
            p.grad.copy_(buf[off:off + p.numel()].view_as(p))
            off += p.numel()
        return buf[off:].to(torch.float64).cpu()

    # ------------------------------------------------------------ weights and checkpoints
    def _full_state(self) -> dict[str, torch.Tensor]:
        """The policy's state in the transformers layout (Megatron: the LM's shards gathered,
        once per optimizer step: publishing and checkpointing a version share one gather)."""
        if not self.megatron:
            return self.policy.state_dict()
        if self._full_cache is None:
            from .megatron_lm import gather_hf

            out = {k: v for k, v in self.policy.state_dict().items() if not k.startswith("lm.")}
            out.update({f"lm.{k}": v for k, v in gather_hf(self.policy.lm.gpt, self.lm_config).items()})
            self._full_cache = out
        return self._full_cache

    def _load_full_state(self, model, state: dict[str, torch.Tensor], frozen: dict | None = None) -> None:
        if not self.megatron:
            load_model(model, state, frozen, "the checkpoint", base_fp=self.base_fp)
            return
        from .megatron_lm import hf_to_mcore

        lm = {k[3:]: v for k, v in state.items() if k.startswith("lm.")}
        model.load_state_dict({k: v for k, v in state.items() if not k.startswith("lm.")}, strict=False)
        model.lm.gpt.load_state_dict(hf_to_mcore(lm, self.lm_config, self.tp, self.tp_rank), strict=False)

    def weights(self) -> np.ndarray:
        """Flat float32 parameters of the current version, in the transformers model's order
        (collective with Megatron). π_prox, where kept, is the model at the version's start: a
        mid-version resume has moved on from it, and publishing the model under the same version
        number would give that number to other weights (the rows it then produces would pass
        as on-policy). Without π_prox no row's version decides anything, so the model serves.
        Megatron gathers the model's shards and does not yet publish π_prox: after a mid-version
        resume it still republishes the moved-on model under the version's number."""
        if self.fsdp:
            return self._gather_trainable(self.prox.tensors() if self.prox is not None else trainable(self.policy))
        if not self.megatron:
            return flat_params(self.prox if self.prox is not None else self.policy)
        state = self._full_state()
        return torch.cat([state[name].detach().float().reshape(-1).cpu() for name in self.export_names]).numpy()

    def _gather_trainable(self, tensors) -> np.ndarray | None:
        """FSDP: the trainable parameters `tensors` (sharded) flat float32 on Trainer 0, gathered
        one tensor at a time (collective; the other ranks keep nothing)."""
        parts = []
        for p in tensors:
            whole = fsdp.full(p.detach())
            if self.index == 0:
                parts.append(whole.float().reshape(-1).cpu())
        return torch.cat(parts).numpy() if parts else None

    def digest(self) -> str:
        """sha256 of this rank's parameters (data-parallel replicas must agree; under FSDP, of
        this rank's shards)."""
        if self.fsdp:
            local = [p.detach().to_local().float().reshape(-1).cpu() for p in trainable(self.policy)]
            return hashlib.sha256(torch.cat(local).numpy().tobytes()).hexdigest()
        return hashlib.sha256(flat_params(self.policy).tobytes()).hexdigest()

    def state(self, mid_version: bool) -> dict:
        """Model (transformers layout, whatever the backend) and optimizer; with Megatron the
        optimizer state of every TP rank, in rank order (collective); with FSDP this rank's shards
        (DTensors), the optimizer's keyed by parameter name (each rank writes its own part)."""
        if self.fsdp:
            return self._fsdp_state(mid_version)
        opt = self.opt.state_dict()
        if self.megatron:
            import torch.distributed as dist
            from megatron.core import parallel_state

            group = parallel_state.get_tensor_model_parallel_group()
            per_rank = [None] * self.tp
            dist.all_gather_object(per_rank, opt, group=group)
            opt = {"tp_ranks": per_rank}
        out = {"model": self._trained(self._full_state()), "optimizer": opt}
        if mid_version and self.prox is not None:
            out["prox"] = self._trained(self.prox.state_dict())
        return {**out, **self._frozen_record()}

    def _fsdp_state(self, mid_version: bool) -> dict:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        out = {"model": self._trained(self.policy.state_dict()), "optimizer": get_optimizer_state_dict(self.policy, self.opt)}
        if mid_version and self.prox is not None:
            out["prox"] = self._trained(self.prox.state_dict())
        return {**out, **self._frozen_record()}

    def _frozen_record(self) -> dict:
        """What a checkpoint that leaves the frozen base out says of it (empty without one)."""
        if not self.frozen_keys:
            return {}
        return {"frozen": {"keys": self.frozen_keys, "fingerprint": self.base_fp, "base": self.base}}

    def _trained(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`state` without the frozen base (a LoRA run's checkpoint holds what trains)."""
        frozen = set(self.frozen_keys)
        return {k: v for k, v in state.items() if k not in frozen} if frozen else state

    def load_state(self, state: dict) -> None:
        """The state `load` read (a sharded checkpoint's tensors are in place already: it loads
        them as it reads them)."""
        self._full_cache = None
        if "loaded_in_place" in state:
            if self.prox is not None and "prox" not in state["loaded_in_place"]:
                self.prox.refresh()   # at a version boundary π_prox is the model
            return
        frozen = state.get("frozen")
        self._load_full_state(self.policy, state["model"], frozen)
        opt = state["optimizer"]
        self.opt.load_state_dict(opt["tp_ranks"][self.tp_rank] if "tp_ranks" in opt else opt)
        if self.prox is not None:
            # Mid-version: π_prox as saved; at a version boundary it equals the model.
            if "prox" in state:
                load_model(self.prox, state["prox"], frozen, "the checkpoint's π_prox", base_fp=self.base_fp)
            else:
                self._load_full_state(self.prox, state["model"], frozen)

    def save(self, state: dict, path: Path) -> None:
        if self.fsdp:
            sharded_checkpoints.save(state, path, self.ckpt_group, leader=self.index == 0)
        else:
            torch.save(state, path)

    def load(self, path: Path) -> dict:
        """A checkpoint to resume from: a file, read whole (`load_state` loads it), or, with FSDP, a
        sharded folder loaded straight into this rank's shards (collective: each rank reads its
        pieces; a folder written by another Trainer count is resharded as it is read)."""
        if not self.fsdp:   # (the launcher refused a resume whose checkpoints are of the other kind)
            return load_torch(path, map_location=self.device)
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        rest = load_torch(path / sharded_checkpoints.TRAINER_FILE)
        if rest.get("frozen") is not None:
            check_base(rest["frozen"], self.base_fp, str(path))
        parts = {"model": self._trained(self.policy.state_dict()), "optimizer": get_optimizer_state_dict(self.policy, self.opt)}
        if "prox" in sharded_checkpoints.saved_parts(path) and self.prox is not None:
            parts["prox"] = self._trained(self.prox.state_dict())
        sharded_checkpoints.load_into(path, parts, self.ckpt_group)
        set_optimizer_state_dict(self.policy, self.opt, parts["optimizer"])
        return {**rest, "loaded_in_place": tuple(parts)}
