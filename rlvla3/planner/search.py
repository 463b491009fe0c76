"""The search: `propose(profile, gpus)` scores Generator/Trainer splits and knobs with the analytic
model, re-checks the best few with the DES, and returns the best with the sync baselines and the
naive 1:1 split beside it; `ladder_layouts` gives the paper's ablation rungs."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..config import GeneratorConfig, ModeConfig, ShardingConfig
from .analytic import Estimate, analytic
from .des import DesResult, simulate
from .layout import Layout, envs_per_sim_rank
from .profile import Profile, require

CPU_CORES_PER_GPU = 16
"""Default CPU budget: the shipped slurm_G.yaml give G Simulator ranks x 16 cores for G GPUs."""

# The naive layout: what a user gets from the shipped configs without the planner.
NAIVE_B_MAX = GeneratorConfig().b_max
NAIVE_T_MAX_MS = GeneratorConfig().t_max_ms
NAIVE_ETA = ModeConfig().eta
NAIVE_GROUPS_PER_RANK = ShardingConfig().groups_per_rank

# The search space of `propose`.
GROUP_SIZES = (1, 2, 4, 8, 16, 32)
B_MAX_CHOICES = (8, 16, 32, 64, 128)
T_MAX_CHOICES_MS = (2.0, 5.0, 10.0, 20.0, 50.0)
ETAS = (0, 1, 2)
ENVS_PER_GEN_LADDER = (4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
"""Env counts per Generator tried below the CPU budget (fewer envs: less staleness and CPU)."""
MAX_SPLITS = 64
"""At most this many Generator/Trainer splits are scored (evenly spaced above 64 GPUs)."""
NEAR_BEST = 0.01
"""Candidates within 1% of the best analytic throughput count as ties; ties prefer lower eta,
then fewer envs (staleness and CPU cost), then fewer Generator GPUs."""
DES_CHECKS = 3
"""How many of the analytic model's best (distinct) candidates `propose` re-checks with the DES."""



@dataclass(frozen=True)
class Scored:
    layout: Layout
    analytic: Estimate
    des: DesResult | None = None

    @property
    def best_estimate(self) -> float:
        return self.des.steps_per_s if self.des is not None else self.analytic.steps_per_s


@dataclass(frozen=True)
class Proposal:
    """The planner's answer for one GPU budget."""

    profile: Profile
    gpus: int
    cpu_cores: int
    best: Scored
    checked: tuple[Scored, ...]
    """The candidates re-checked with the DES (best first by DES throughput)."""
    sync_colocated: Scored
    sync_disaggregated: Scored
    naive: Scored
    """Async, 1:1 Generator/Trainer split, the shipped configs' knobs."""
    candidates: int
    """How many layouts the analytic model scored."""

    @property
    def best_sync(self) -> Scored:
        a, b = self.sync_colocated, self.sync_disaggregated
        return a if a.best_estimate >= b.best_estimate else b


def check_gpus(profile: Profile, gpus: int) -> None:
    require(gpus >= 2, "gpus", gpus, "need at least 2 GPUs (one Generator, one Trainer)")
    n = profile.gpus_per_node
    require(gpus <= n or gpus % n == 0, "gpus", gpus,
           f"must fill whole GPU nodes of profile.gpus_per_node={n} (or fit in one)")


def env_budget(profile: Profile, cpu_cores: int) -> int:
    n = int(cpu_cores // profile.cores_per_env)
    require(n >= 1, "cpu_cores", cpu_cores, f"holds no env at profile.cores_per_env={profile.cores_per_env}")
    return n


def _splits(gpus: int) -> list[int]:
    """Generator GPU counts to try (all of them up to MAX_SPLITS, else evenly spaced plus 1:1)."""
    if gpus - 1 <= MAX_SPLITS:
        return list(range(1, gpus))
    step = math.ceil((gpus - 1) / MAX_SPLITS)
    return sorted(set(range(step, gpus, step)) | {gpus // 2})


def _envs_per_gen(max_envs: int, gen_gpus: int, group_size: int) -> list[int]:
    top = max_envs // gen_gpus
    out = {e for e in ENVS_PER_GEN_LADDER if e <= top} | {top}
    return sorted({e - e % group_size for e in out if e - e % group_size >= group_size})


def _b_max_choices(profile: Profile, group_size: int) -> list[int]:
    return [b for b in B_MAX_CHOICES if group_size <= b <= profile.max_batch] or [min(profile.max_batch, group_size)]


def async_candidates(profile: Profile, gpus: int, max_envs: int):
    """Every async (disaggregated, env-level, overlap, streaming) layout of the search space."""
    rank_envs = envs_per_sim_rank(profile)
    for gen in _splits(gpus):
        for k in GROUP_SIZES:
            if k > rank_envs or k > profile.max_batch:
                continue
            for e in _envs_per_gen(max_envs, gen, k):
                for b in _b_max_choices(profile, k):
                    for t in T_MAX_CHOICES_MS:
                        for eta in ETAS:
                            yield Layout(gen, gpus - gen, e, k, b, t, eta)


def _preference(s: Scored, best: float):
    """Sort key: near-best throughput first, then lower eta, fewer envs, fewer Generator GPUs."""
    thr = s.analytic.steps_per_s
    if thr >= best * (1 - NEAR_BEST):
        return (0, s.layout.eta, s.layout.num_envs, s.layout.gen_gpus, -thr)
    return (1, 0, 0, 0, -thr)  # the rest: by throughput only


def naive_layout(profile: Profile, gpus: int, max_envs: int) -> Layout:
    """The shipped configs' async run: 1:1 split, groups_per_rank groups per Simulator rank."""
    gen = max(1, gpus // 2)
    k = max(1, envs_per_sim_rank(profile) // NAIVE_GROUPS_PER_RANK)
    k = min(k, NAIVE_B_MAX, profile.max_batch)
    e = (max_envs // gen) // k * k
    require(e >= k, "cpu_cores", max_envs, f"too few envs for {gen} Generators with groups of {k}")
    return Layout(gen, gpus - gen, e, k, max(NAIVE_B_MAX, k), NAIVE_T_MAX_MS, NAIVE_ETA)


def sync_layouts(profile: Profile, gpus: int, max_envs: int) -> tuple[list[Layout], list[Layout]]:
    """Sync candidates: colocated on all GPUs, and disaggregated over every split; groups as in
    the naive layout, B_max over the search space (the lockstep batch is split in B_max chunks)."""
    base = naive_layout(profile, gpus, max_envs)
    k = base.group_size
    sync = dict(env_level=False, overlap=False, streaming=False, eta=0, t_max_ms=0.0)
    colo, dis = [], []
    for b in _b_max_choices(profile, k):
        e = (max_envs // gpus) // k * k
        if e >= k:
            colo.append(Layout(gpus, gpus, e, k, b, placement="colocated", **sync))
        for gen in _splits(gpus):
            e = (max_envs // gen) // k * k
            if e >= k:
                dis.append(Layout(gen, gpus - gen, e, k, b, **sync))
    return colo, dis


def _best_analytic(profile: Profile, layouts: list[Layout]) -> Scored:
    scored = [Scored(lay, analytic(profile, lay)) for lay in layouts]
    return max(scored, key=lambda s: s.analytic.steps_per_s)


def propose(profile: Profile, gpus: int, cpu_cores: int | None = None, des_checks: int = DES_CHECKS,
            seed: int = 0) -> Proposal:
    """Search async layouts with the analytic model, re-check the best few with the DES.

    The CPU budget (default CPU_CORES_PER_GPU per GPU) bounds the envs; the answer is the
    Generator/Trainer split, envs per Generator (the env-to-GPU ratio), group size, B_max,
    T_max and eta. The returned sync baselines and naive split are scored the same way."""
    check_gpus(profile, gpus)
    cpu_cores = CPU_CORES_PER_GPU * gpus if cpu_cores is None else cpu_cores
    max_envs = env_budget(profile, cpu_cores)
    scored = [Scored(lay, analytic(profile, lay)) for lay in async_candidates(profile, gpus, max_envs)]
    require(bool(scored), "gpus", gpus, f"no valid layout with {max_envs} envs")
    best_thr = max(s.analytic.steps_per_s for s in scored)
    scored.sort(key=lambda s: _preference(s, best_thr))
    picked, seen = [], set()
    for s in scored:  # distinct splits/env counts/groupings: skip ones differing only in knobs
        key = (s.layout.gen_gpus, s.layout.envs_per_gen, s.layout.group_size)
        if key in seen:
            continue
        seen.add(key)
        picked.append(s)
        if len(picked) >= max(1, des_checks):
            break
    if des_checks > 0:
        checked = [dataclasses.replace(s, des=simulate(profile, s.layout, seed)) for s in picked]
        checked.sort(key=lambda s: -s.des.steps_per_s)
    else:
        checked = picked
    colo, dis = sync_layouts(profile, gpus, max_envs)
    naive = naive_layout(profile, gpus, max_envs)
    return Proposal(profile, gpus, cpu_cores, checked[0], tuple(checked), _best_analytic(profile, colo),
                _best_analytic(profile, dis), Scored(naive, analytic(profile, naive)), len(scored))




def ladder_layouts(profile: Profile, gpus: int, cpu_cores: int | None = None) -> list[tuple[str, Layout]]:
    """The paper's ablation rungs on the naive layout's envs and knobs: sync colocated, sync
    disaggregated 1:1, + overlap (eta 1), + dynamic batching (env-level groups), + streaming."""
    check_gpus(profile, gpus)
    max_envs = env_budget(profile, CPU_CORES_PER_GPU * gpus if cpu_cores is None else cpu_cores)
    base = naive_layout(profile, gpus, max_envs)
    n = base.num_envs
    colo = dataclasses.replace(base, gen_gpus=gpus, train_gpus=gpus, envs_per_gen=n // gpus, placement="colocated",
                               env_level=False, overlap=False, streaming=False, eta=0)
    sync_dis = dataclasses.replace(base, env_level=False, overlap=False, streaming=False, eta=0)
    overlap = dataclasses.replace(sync_dis, overlap=True, eta=1)
    dynamic = dataclasses.replace(overlap, env_level=True)
    streaming = dataclasses.replace(dynamic, streaming=True)
    return [("colocated, sync", colo), ("disaggregated 1:1, sync", sync_dis), ("+ train async (overlap)", overlap),
            ("+ rollout async (dynamic batching)", dynamic), ("+ streamer (streaming micro-batches)", streaming)]
