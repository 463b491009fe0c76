"""A candidate layout of a run (GPUs per role, envs and groups, batching, mode switches) and
what follows from it: envs per Simulator rank, the sharding plan, lockstep components."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import AlgoConfig
from ..world import assign_generators
from .profile import Profile, require

SEGMENT_STEPS = AlgoConfig().segment_steps
"""Steps per segment: the schema's default (each group gives one segment per rollout step)."""
SEGMENTS_PER_STEP = 1
"""Segments each group gives a rollout step (rollout_batch = num_envs x SEGMENT_STEPS), as in the
shipped slurm configs. Streaming needs > 1 to hide training (not searched yet)."""
GLOBAL_BATCHES_PER_STEP = 4
"""global_batch = rollout_batch / 4, as in the shipped conf/cluster/slurm_*.yaml."""
MICRO_BATCH = 64
"""Trainer micro-batch written to planned configs (as in conf/cluster/slurm_*.yaml)."""
CPUS_PER_SIM_RANK = 16
"""Cores per Simulator rank (conf/cluster/slurm_*.yaml)."""
CORES_PER_GPU_NODE = 96
"""Cores per GPU node written to planned configs (conf/cluster/slurm_*.yaml)."""
CPUS_PER_GPU_RANK = 12
"""Cores per Generator/Trainer rank written to planned configs (conf/cluster/slurm_*.yaml)."""



@dataclass(frozen=True)
class Layout:
    """One candidate run: GPUs per role, envs and their grouping, batching and mode switches."""

    gen_gpus: int
    """Generator GPUs (colocated: also the Trainer GPUs)."""
    train_gpus: int
    """Trainer GPUs (colocated: equal to gen_gpus, the same GPUs)."""
    envs_per_gen: int
    """Envs served by each Generator (a multiple of group_size)."""
    group_size: int
    """Envs per group (one request of group_size samples per group step)."""
    b_max: int
    """Batcher: close a batch at this many samples."""
    t_max_ms: float
    """Batcher: close a batch this long after its first request (async only)."""
    eta: int
    """Bounded staleness in versions (0 = per-step weight barrier)."""
    env_level: bool = True
    """Groups loop on their own (off: lockstep over all envs)."""
    overlap: bool = True
    """Training may run while the next step is collected (off: train, then collect)."""
    streaming: bool = True
    """Training starts as soon as a global batch of the step has arrived."""
    placement: str = "disaggregated"
    """disaggregated | colocated (Generators and Trainers share the GPUs)."""
    groups_per_sim: int = 0
    """Groups per Simulator rank; 0 = as many as the profile's cores per rank hold."""

    def __post_init__(self):
        require(self.placement in ("disaggregated", "colocated"), "layout.placement", self.placement,
               "use disaggregated or colocated")
        require(self.gen_gpus >= 1, "layout.gen_gpus", self.gen_gpus, "must be >= 1")
        require(self.train_gpus >= 1, "layout.train_gpus", self.train_gpus, "must be >= 1")
        if self.placement == "colocated":
            require(self.train_gpus == self.gen_gpus, "layout.train_gpus", self.train_gpus,
                   f"colocated placement shares GPUs: must equal gen_gpus={self.gen_gpus}")
        require(self.group_size >= 1, "layout.group_size", self.group_size, "must be >= 1")
        require(self.envs_per_gen >= self.group_size and self.envs_per_gen % self.group_size == 0,
               "layout.envs_per_gen", self.envs_per_gen, f"must be a positive multiple of group_size={self.group_size}")
        require(self.b_max >= self.group_size, "layout.b_max", self.b_max,
               f"must be >= group_size={self.group_size} (a group's request is never split)")
        require(self.t_max_ms >= 0, "layout.t_max_ms", self.t_max_ms, "must be >= 0")
        require(self.eta >= 0, "layout.eta", self.eta, "must be >= 0")
        require(self.overlap or not self.streaming, "layout.streaming", self.streaming, "needs overlap=True")
        require(self.groups_per_sim >= 0, "layout.groups_per_sim", self.groups_per_sim, "must be >= 0 (0 = from cores)")

    @property
    def gpus(self) -> int:
        return self.gen_gpus + (0 if self.placement == "colocated" else self.train_gpus)

    @property
    def num_envs(self) -> int:
        return self.gen_gpus * self.envs_per_gen

    @property
    def groups_per_gen(self) -> int:
        return self.envs_per_gen // self.group_size

    @property
    def rollout_batch(self) -> int:
        """Samples per rollout step: SEGMENTS_PER_STEP segments of every env."""
        return self.num_envs * SEGMENT_STEPS * SEGMENTS_PER_STEP

    @property
    def global_batch(self) -> int:
        return self.rollout_batch // GLOBAL_BATCHES_PER_STEP

    @property
    def gate_eta(self) -> int:
        """The eta the weight gate enforces: without overlap the next step waits for training."""
        return self.eta if self.overlap else 0

    @property
    def mode_name(self) -> str:
        if not self.env_level and not self.overlap:
            return f"sync {self.placement}"
        return "async" if self.env_level else "lockstep+overlap"


def envs_per_sim_rank(profile: Profile, cpus_per_sim_rank: int = CPUS_PER_SIM_RANK) -> int:
    n = int(cpus_per_sim_rank // profile.cores_per_env)
    require(n >= 1, "profile.cores_per_env", profile.cores_per_env,
           f"a Simulator rank of {cpus_per_sim_rank} cores must hold at least one env")
    return n


def layout_sharding(profile: Profile, layout: Layout, cpus_per_sim_rank: int = CPUS_PER_SIM_RANK) -> list[list[int]]:
    """Group sizes per Simulator rank: whole groups packed into ranks of cpus_per_sim_rank cores
    (or layout.groups_per_sim per rank when set)."""
    per_rank = layout.groups_per_sim or envs_per_sim_rank(profile, cpus_per_sim_rank) // layout.group_size
    require(per_rank >= 1, "layout.group_size", layout.group_size,
           f"a Simulator rank holds only {envs_per_sim_rank(profile, cpus_per_sim_rank)} envs")
    groups = layout.num_envs // layout.group_size
    plan = []
    while groups > 0:
        take = min(per_rank, groups)
        plan.append([layout.group_size] * take)
        groups -= take
    return plan


def lockstep_components(profile: Profile, layout: Layout) -> list[list[int]]:
    """How the engine's sync mode couples envs: a Simulator rank sends when all its groups are
    ready and a Generator serves when all its groups asked, so ranks and Generators that share
    groups advance together. Returns, per coupled component, its group count per Generator.
    (Groups go to Generators exactly as config.derive assigns them.)"""
    plan = layout_sharding(profile, layout)
    flat = [(r, size) for r, sizes in enumerate(plan) for size in sizes]
    owners = assign_generators([size for _, size in flat], layout.gen_gpus)
    parent = list(range(len(plan) + layout.gen_gpus))  # union-find: sims, then Generators

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (r, _), g in zip(flat, owners):
        parent[root(r)] = root(len(plan) + g)
    comps: dict[int, list[int]] = {}
    for g in range(layout.gen_gpus):
        comps.setdefault(root(len(plan) + g), []).append(owners.count(g))
    return list(comps.values())
