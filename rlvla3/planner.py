"""The planner: how to spend G GPUs (and the CPU cores beside them) on an rlvla3 run.

Two models of the engine, both fed by a `Profile` of measured (or hand-written) component costs:

- `analytic(profile, layout)`: a bottleneck model. Steady-state env steps/s is the minimum of the
  stage capacities (Simulator groups, Generators, Trainer), with sync mode's serialisation
  (rollout, then train, then weight sync). Microseconds per call, so `plan` can search with it.
- `simulate(profile, layout)`: a discrete-event simulation (simpy) of what the engine does: env
  groups as processes, Generators with the engine's batching rule and the eta credit gate, a
  data-parallel Trainer that publishes versions. Slower, but it has the effects the analytic
  model averages away (heavy-tailed steps, pipeline drain at rollout-step boundaries, staleness).

`plan(profile, gpus)` searches Generator/Trainer splits and knobs with the analytic model,
re-checks the best few with the DES and returns the best, with the sync baselines and the naive
1:1 split beside it. Times inside the models are in milliseconds; results are env steps/s.

Neither model has been validated against the real engine on a cluster yet: they encode the
engine's rules as the brief states them (see `simulate`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .batcher import DynamicBatcher
from .config import AlgoConfig, GeneratorConfig, ModeConfig, PolicyConfig, ShardingConfig, assign_generators


class PlannerError(ValueError):
    """A bad profile, layout or planner argument; the message names it and how to fix it."""


# ---------------------------------------------------------------- named constants

MS_PER_S = 1000.0
SEGMENT_STEPS = AlgoConfig().segment_steps
"""Steps per segment: the schema's default (each group gives one segment per rollout step)."""
SEGMENTS_PER_STEP = 1
"""Segments each group gives a rollout step (rollout_batch = num_envs x SEGMENT_STEPS), as in the
shipped slurm configs. Streaming needs > 1 to hide training (not searched yet)."""
GLOBAL_BATCHES_PER_STEP = 4
"""global_batch = rollout_batch / 4, as in the shipped conf/cluster/slurm_*.yaml."""
MICRO_BATCH = 64
"""Trainer micro-batch written to planned configs (as in conf/cluster/slurm_*.yaml)."""
CPU_CORES_PER_GPU = 16
"""Default CPU budget: the shipped slurm_G.yaml give G Simulator ranks x 16 cores for G GPUs."""
CPUS_PER_SIM_RANK = 16
"""Cores per Simulator rank (conf/cluster/slurm_*.yaml)."""
CORES_PER_GPU_NODE = 96
"""Cores per GPU node written to planned configs (conf/cluster/slurm_*.yaml)."""
CPUS_PER_GPU_RANK = 12
"""Cores per Generator/Trainer rank written to planned configs (conf/cluster/slurm_*.yaml)."""

# The naive layout: what a user gets from the shipped configs without the planner.
NAIVE_B_MAX = GeneratorConfig().b_max
NAIVE_T_MAX_MS = GeneratorConfig().t_max_ms
NAIVE_ETA = ModeConfig().eta
NAIVE_GROUPS_PER_RANK = ShardingConfig().groups_per_rank

# The search space of `plan`.
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
"""How many of the analytic model's best (distinct) candidates `plan` re-checks with the DES."""

# The DES.
DES_WARMUP_VERSIONS = 2
"""Versions published before measuring (fills the pipeline, desynchronises groups)."""
DES_MEASURE_VERSIONS = 6
"""Versions measured after the warm-up; throughput = rollout_batch x versions / their time."""
DES_MAX_GENERATORS = 8
"""Async layouts with more Generators are simulated as a proportional slice of this many
Generators (with their envs and the same share of Trainer GPUs): Generators only interact
through the Trainer, so the slice's steady state is the whole run's, scaled."""
DES_MAX_SIM_MS = 3_600_000.0
"""Simulated-time safety limit (one hour) for layouts that publish versions very slowly."""
DES_DRAW_BLOCK = 256
"""Env step times are drawn in blocks of this many group steps (numpy per block, not per step)."""
LOGNORMAL_GRID = 4001
"""Grid points of the numerical integral for E[max of n log-normals]."""
GPU_SATURATED = 0.98
"""A Generator busy this fraction of the time is reported as the bottleneck."""
FIXED_POINT_ITERS = 200
FIXED_POINT_TOL = 1e-9


# ---------------------------------------------------------------- profile


@dataclass(frozen=True)
class Profile:
    """Component costs of one workload (simulator + policy + hardware). All times in ms."""

    name: str
    """What was profiled (e.g. libero_pi05)."""
    step_ms: float
    """Median latency of one env step on one core (physics + rendering)."""
    step_sigma: float
    """Log-normal sigma of the env step latency (0 = constant; the tail makes lockstep slow)."""
    reset_ms: float
    """Extra latency of the step at which an episode ends (the env resets inside that step)."""
    episode_steps: int
    """Episode length in env steps (fixed: every env resets every episode_steps steps)."""
    infer_fixed_ms: float
    """Generator forward time = infer_fixed_ms + infer_per_sample_ms * samples (one GPU)."""
    infer_per_sample_ms: float
    """Per-sample part of the Generator forward time (one GPU)."""
    max_batch: int
    """Largest batch the Generator's model accepts (caps B_max)."""
    train_samples_per_s: float
    """Trainer throughput per GPU in samples/s (forward + backward + optimizer, all epochs)."""
    weight_sync_ms: float
    """Publishing a version: Trainer -> Generators weight transfer and load, once per rollout step."""
    cores_per_cpu_node: int
    """Cores of one CPU (Simulator) node."""
    gpus_per_node: int
    """GPUs of one GPU node; a plan fills whole nodes."""
    cores_per_env: float
    """CPU cores one env needs to run at step_ms (1/envs per Simulator core)."""
    request_overhead_ms: float = 0.0
    """Engine latency per request beyond batching and the forward (messages, polling): added
    to every round trip."""
    shard_delay_ms: float = 0.0
    """From a segment's end to its shard being announced to the Trainer (write + rename on the
    shared filesystem, on the Simulator's writer thread)."""

    def __post_init__(self):
        positive = ("step_ms", "episode_steps", "max_batch", "train_samples_per_s", "cores_per_cpu_node",
                    "gpus_per_node", "cores_per_env")
        for name in positive:
            _check(getattr(self, name) > 0, f"profile.{name}", getattr(self, name), "must be > 0")
        for name in ("step_sigma", "reset_ms", "infer_fixed_ms", "infer_per_sample_ms", "weight_sync_ms",
                     "request_overhead_ms", "shard_delay_ms"):
            _check(getattr(self, name) >= 0, f"profile.{name}", getattr(self, name), "must be >= 0")


def _check(ok: bool, name: str, value, fix: str) -> None:
    if not ok:
        raise PlannerError(f"{name}={value!r}: {fix}")


PROFILE_FIELDS = tuple(f.name for f in dataclasses.fields(Profile))
OPTIONAL_FIELDS = ("request_overhead_ms", "shard_delay_ms")
"""Engine overheads a hand-written profile may leave out (0: an ideal engine)."""
_INT_FIELDS = ("episode_steps", "max_batch", "cores_per_cpu_node", "gpus_per_node")


def load_profile(path: str | Path) -> Profile:
    """A Profile from YAML (safe_load: data only). Unknown or missing keys fail, naming them."""
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    _check(isinstance(data, dict), "profile file", str(path), "must be a YAML mapping of Profile fields")
    unknown = sorted(set(data) - set(PROFILE_FIELDS))
    missing = sorted(set(PROFILE_FIELDS) - set(data) - set(OPTIONAL_FIELDS))
    _check(not unknown, f"profile {path}", unknown, f"unknown keys; the fields are {list(PROFILE_FIELDS)}")
    _check(not missing, f"profile {path}", missing, "missing keys")
    values = {}
    for name in PROFILE_FIELDS:
        if name not in data:
            continue  # an optional field: the schema's default
        v = data[name]
        if name == "name":
            values[name] = str(v)
            continue
        _check(isinstance(v, (int, float)) and not isinstance(v, bool), f"profile.{name}", v, "must be a number")
        if name in _INT_FIELDS:
            _check(float(v).is_integer(), f"profile.{name}", v, "must be an integer")
            v = int(v)
        values[name] = v
    return Profile(**values)


def save_profile(profile: Profile, path: str | Path) -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump(dataclasses.asdict(profile), sort_keys=False))


# ---------------------------------------------------------------- layout


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
        _check(self.placement in ("disaggregated", "colocated"), "layout.placement", self.placement,
               "use disaggregated or colocated")
        _check(self.gen_gpus >= 1, "layout.gen_gpus", self.gen_gpus, "must be >= 1")
        _check(self.train_gpus >= 1, "layout.train_gpus", self.train_gpus, "must be >= 1")
        if self.placement == "colocated":
            _check(self.train_gpus == self.gen_gpus, "layout.train_gpus", self.train_gpus,
                   f"colocated placement shares GPUs: must equal gen_gpus={self.gen_gpus}")
        _check(self.group_size >= 1, "layout.group_size", self.group_size, "must be >= 1")
        _check(self.envs_per_gen >= self.group_size and self.envs_per_gen % self.group_size == 0,
               "layout.envs_per_gen", self.envs_per_gen, f"must be a positive multiple of group_size={self.group_size}")
        _check(self.b_max >= self.group_size, "layout.b_max", self.b_max,
               f"must be >= group_size={self.group_size} (a group's request is never split)")
        _check(self.t_max_ms >= 0, "layout.t_max_ms", self.t_max_ms, "must be >= 0")
        _check(self.eta >= 0, "layout.eta", self.eta, "must be >= 0")
        _check(self.overlap or not self.streaming, "layout.streaming", self.streaming, "needs overlap=True")
        _check(self.groups_per_sim >= 0, "layout.groups_per_sim", self.groups_per_sim, "must be >= 0 (0 = from cores)")

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
    _check(n >= 1, "profile.cores_per_env", profile.cores_per_env,
           f"a Simulator rank of {cpus_per_sim_rank} cores must hold at least one env")
    return n


def sharding_plan(profile: Profile, layout: Layout, cpus_per_sim_rank: int = CPUS_PER_SIM_RANK) -> list[list[int]]:
    """Group sizes per Simulator rank: whole groups packed into ranks of cpus_per_sim_rank cores
    (or layout.groups_per_sim per rank when set)."""
    per_rank = layout.groups_per_sim or envs_per_sim_rank(profile, cpus_per_sim_rank) // layout.group_size
    _check(per_rank >= 1, "layout.group_size", layout.group_size,
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
    plan = sharding_plan(profile, layout)
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


# ---------------------------------------------------------------- analytic model


def forward_ms(profile: Profile, samples: int) -> float:
    return profile.infer_fixed_ms + profile.infer_per_sample_ms * samples


@lru_cache(maxsize=4096)
def expected_max_lognormal(n: int, median: float, sigma: float) -> float:
    """E[max of n iid LogNormal(log median, sigma)] = integral of (1 - F(x)^n) dx, in log space.

    Lockstep pays this with n = all envs every step; a group of k envs pays it with n = k."""
    if sigma == 0 or n == 1:
        return median * math.exp(sigma * sigma / 2)
    z = np.linspace(-10.0, 10.0, LOGNORMAL_GRID)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in z]))
    integrand = (1.0 - cdf ** n) * median * sigma * np.exp(sigma * z)
    return float(np.sum((integrand[1:] + integrand[:-1]) * 0.5) * (z[1] - z[0]))


@lru_cache(maxsize=4096)
def max_lognormal_sd(n: int, median: float, sigma: float) -> float:
    """Standard deviation of the max of n iid LogNormal(log median, sigma) (density integral)."""
    if sigma == 0:
        return 0.0
    z = np.linspace(-10.0, 10.0, LOGNORMAL_GRID)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in z]))
    density = n * cdf ** (n - 1) * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    x = median * np.exp(sigma * z)
    dz = z[1] - z[0]
    mean = float(np.sum(x * density) * dz)
    return math.sqrt(max(float(np.sum(x * x * density) * dz) - mean * mean, 0.0))


@lru_cache(maxsize=1024)
def expected_max_std_normal(n: int) -> float:
    """E[max of n iid N(0, 1)] (0 for n = 1)."""
    if n == 1:
        return 0.0
    z = np.linspace(-10.0, 10.0, LOGNORMAL_GRID)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in z]))
    return float(np.sum(z * n * cdf ** (n - 1) * np.exp(-z * z / 2) / math.sqrt(2 * math.pi)) * (z[1] - z[0]))


def group_step_ms(profile: Profile, group_size: int) -> float:
    """Mean wall time of one group step: the slowest of its envs, plus the reset amortised.

    All envs of a group start together and episodes have a fixed length, so a group's envs
    reset in the same step: that step costs reset_ms more, once per episode."""
    return (expected_max_lognormal(group_size, profile.step_ms, profile.step_sigma)
            + profile.reset_ms / profile.episode_steps)


@dataclass(frozen=True)
class GenEstimate:
    """The closed loop of one Generator and its groups, at steady state."""

    samples_per_s: float
    round_trip_ms: float
    """Request sent -> actions back (batch wait + queueing + forward)."""
    batch_samples: float
    saturated: bool


def _chunks(sizes: list[int], b_max: int) -> list[int]:
    """Whole groups packed greedily, in order, into batches of at most b_max samples."""
    out, cur = [], 0
    for s in sizes:
        if cur + s > b_max:
            out.append(cur)
            cur = 0
        cur += s
    return out + [cur] if cur else out


@lru_cache(maxsize=1 << 16)
def generator_loop(profile: Profile, groups: int, group_size: int, b_max: int, t_max_ms: float) -> GenEstimate:
    """Fixed point of the Generator's closed loop (the approximation in this model).

    `groups` groups each alternate a group step (mean S) and a request round trip W. Their
    request rate X = groups / (S + W). A batch gathers the requests arriving within T_max of
    its first one, or while the GPU forwards the previous batch, up to B_max samples; a request
    waits on average half the gathering window (all of it when it is alone), plus the residual
    forward of a busy GPU, plus its own forward. Exact when forwards cost nothing and T_max = 0."""
    S = group_step_ms(profile, group_size) + profile.request_overhead_ms
    r_max = max(1, min(groups, b_max // group_size))
    cap = r_max * group_size / max(forward_ms(profile, r_max * group_size), 1e-12)  # samples/ms
    x = groups / (S + forward_ms(profile, group_size))  # requests/ms, first guess
    r, w, rho = 1.0, forward_ms(profile, group_size), 0.0
    fill = math.ceil(b_max / group_size) - 1  # further requests that would close the batch early
    for _ in range(FIXED_POINT_ITERS):
        f = forward_ms(profile, r * group_size)
        r = min(max(1.0 + x * t_max_ms, x * f, 1.0), r_max)
        f = forward_ms(profile, r * group_size)
        first_wait = t_max_ms if fill == 0 or x == 0 else min(t_max_ms, fill / x)
        if groups * group_size < b_max:
            first_wait = t_max_ms  # never fills: every batch closes on the timer
        close_wait = first_wait * (r + 1) / (2 * r)
        rho = min(x * group_size * f / (r * group_size), 1.0) if r > 0 else 0.0
        w = close_wait + rho * f / 2 + f
        x_new = min(groups / (S + w), cap / group_size)
        if abs(x_new - x) <= FIXED_POINT_TOL * max(x, 1e-12):
            x = x_new
            break
        x = 0.5 * x + 0.5 * x_new
    at_cap = x * group_size >= cap * (1 - 1e-6)
    saturated = at_cap or rho >= GPU_SATURATED
    if at_cap:
        w = groups / x - S  # the closed loop: queueing absorbs the rest
    return GenEstimate(x * group_size * MS_PER_S, w, r * group_size, saturated)


def lockstep_step_ms(profile: Profile, layout: Layout) -> tuple[float, float]:
    """(sim, inference) ms of one lockstep env step, as the engine runs sync mode: within a
    coupled component (`lockstep_components`) every Generator serves all its groups in B_max
    chunks, then all the component's envs step; components advance on their own between weight
    barriers. So a step costs the slowest env of the largest component, plus the barrier's share:
    the slowest of the components' sums over a rollout step (normal approximation), spread over
    its steps."""
    comps = lockstep_components(profile, layout)
    envs = max(sum(c) for c in comps) * layout.group_size
    steps = SEGMENT_STEPS * SEGMENTS_PER_STEP
    mean = expected_max_lognormal(envs, profile.step_ms, profile.step_sigma)
    sd = max_lognormal_sd(envs, profile.step_ms, profile.step_sigma)
    barrier = sd * expected_max_std_normal(len(comps)) / math.sqrt(steps)
    sim = mean + barrier + profile.reset_ms / profile.episode_steps + profile.request_overhead_ms
    inf = max(sum(forward_ms(profile, c) for c in _chunks([layout.group_size] * n, layout.b_max))
              for comp in comps for n in comp)
    return sim, inf


def streaming_finish_s(roll_s: float, rollout_batch: int, global_batch: int, gb_train_s: float) -> float:
    """When a streaming Trainer finishes a step that takes roll_s to collect.

    Data arrives in shards of one segment per group, so a step's samples arrive in
    SEGMENTS_PER_STEP waves (groups progress at about the same pace); an optimizer step starts
    when its global batch is in and the previous one is done. With one segment per rollout step
    everything arrives at the end and streaming hides nothing."""
    t = 0.0
    for j in range(rollout_batch // global_batch):
        wave = math.ceil((j + 1) * global_batch * SEGMENTS_PER_STEP / rollout_batch)
        t = max(t, roll_s * wave / SEGMENTS_PER_STEP) + gb_train_s
    return t


@dataclass(frozen=True)
class Estimate:
    """A model's prediction for one layout."""

    steps_per_s: float
    bottleneck: str
    utilization: dict = field(default_factory=dict)
    """Busy fraction per role: sim (groups stepping), generator (forwarding), trainer."""
    staleness: float = float("nan")
    """Mean (rollout step - version that produced the sample); NaN where not modelled."""
    detail: dict = field(default_factory=dict)


def analytic(profile: Profile, layout: Layout) -> Estimate:
    """The bottleneck model: seconds per rollout step from the stage times and the mode's overlap."""
    R = layout.rollout_batch
    train_s = R / (profile.train_samples_per_s * layout.train_gpus)
    sync_s = profile.weight_sync_ms / MS_PER_S
    shard_s = profile.shard_delay_ms / MS_PER_S   # the last shard of a step reaches the Trainer late
    gb_train_s = layout.global_batch / (profile.train_samples_per_s * layout.train_gpus)
    if layout.env_level:
        _check(layout.placement == "disaggregated", "layout.placement", layout.placement,
               "the analytic model covers env-level (async) rollout only on disaggregated GPUs")
        g = generator_loop(profile, layout.groups_per_gen, layout.group_size, layout.b_max, layout.t_max_ms)
        roll_rate = g.samples_per_s * layout.gen_gpus
        roll_s = R / roll_rate
        per_batch_ms = forward_ms(profile, g.batch_samples)
        gen_busy_per_sample_s = per_batch_ms / g.batch_samples / MS_PER_S
        roll_bound = "generator" if g.saturated else "sim"
    else:
        sim_ms, inf_ms = lockstep_step_ms(profile, layout)  # per lockstep env step
        steps = R // layout.num_envs
        roll_s = steps * (sim_ms + inf_ms) / MS_PER_S
        gen_busy_per_sample_s = inf_ms / layout.envs_per_gen / MS_PER_S
        roll_bound = "lockstep"
        g = None
    if layout.placement == "colocated":
        _check(not layout.overlap, "layout.overlap", layout.overlap,
               "colocated GPUs cannot overlap training with inference in this model")
    if not layout.overlap or (layout.gate_eta == 0 and not layout.streaming):
        step_s, bound = roll_s + shard_s + train_s + sync_s, "serial"
    elif layout.gate_eta == 0:  # streaming with a weight barrier: training follows the arriving segments
        step_s = streaming_finish_s(roll_s + shard_s, R, layout.global_batch, gb_train_s) + sync_s
        bound = "serial"
    else:
        step_s = max(roll_s, train_s + sync_s)
        bound = "trainer" if train_s + sync_s > roll_s else roll_bound
    thr = R / step_s
    util = {  # busy fractions: groups stepping (their own slowest env), GPUs forwarding, Trainer
        "sim": min(1.0, thr * group_step_ms(profile, layout.group_size) / MS_PER_S / layout.num_envs),
        "generator": min(1.0, thr * gen_busy_per_sample_s / layout.gen_gpus),
        "trainer": min(1.0, (train_s + sync_s) / step_s),
    }
    detail = {"roll_s": roll_s, "train_s": train_s, "sync_s": sync_s, "step_s": step_s}
    if g is not None:
        detail.update(round_trip_ms=g.round_trip_ms, batch_samples=g.batch_samples)
    return Estimate(thr, bound, util, float("nan"), detail)


# ---------------------------------------------------------------- discrete-event simulation


class _Request:
    __slots__ = ("gid", "n", "step", "arrived", "done")

    def __init__(self, gid, n, step, arrived, done):
        self.gid, self.n, self.step, self.arrived, self.done = gid, n, step, arrived, done


class _Counters:
    """Busy time per role and samples, snapshotted when measuring starts."""

    def __init__(self):
        self.sim_busy = self.gen_busy = self.train_busy = 0.0
        self.stale_sum = 0.0
        self.stale_n = 0
        self.env_steps = 0

    def snapshot(self) -> dict:
        return dict(vars(self))


class _Generator:
    """One Generator GPU: the engine's DynamicBatcher (FIFO, whole requests, close at B_max
    samples or T_max after the first request) plus the eta gate (requests of a rollout step
    beyond the granted one are held; released, their batch clock restarts)."""

    def __init__(self, des, gpu, b_max: int, t_max_ms: float):
        self.des, self.gpu = des, gpu
        self.batcher = DynamicBatcher(b_max, t_max_ms)  # the engine's own (times in ms here)
        self.held: list[_Request] = []
        self.wakeup = des.env.event()

    def submit(self, req: _Request) -> None:
        if req.step <= self.des.granted:
            self._enqueue(req)
        else:
            self.held.append(req)

    def _enqueue(self, req: _Request) -> None:
        self.batcher.add(req)
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def release(self) -> None:
        held, self.held = self.held, []
        for req in held:
            req.arrived = self.des.env.now
            self.submit(req)

    def run(self):
        env, b = self.des.env, self.batcher
        while True:
            while not b.queue:
                self.wakeup = env.event()
                yield self.wakeup
            while not b.ready(env.now):
                self.wakeup = env.event()
                yield env.any_of([self.wakeup, env.timeout(b.deadline() - env.now)])
            yield from self.forward(b.pop())

    def forward(self, batch: list[_Request]):
        env = self.des.env
        n = sum(r.n for r in batch)
        with self.gpu.request() as got:
            yield got
            version = self.des.version
            dt = forward_ms(self.des.profile, n)
            yield env.timeout(dt)
            self.des.counters.gen_busy += dt
        for r in batch:
            r.done.succeed(version)


class _Des:
    """State shared by the processes of one simulation."""

    def __init__(self, profile: Profile, layout: Layout, trainer_gpus: float, seed: int):
        import simpy

        self.env = simpy.Environment()
        self.profile, self.layout, self.trainer_gpus = profile, layout, trainer_gpus
        self.rng = np.random.default_rng(seed)
        self.version = 0
        self.granted = layout.gate_eta
        self.version_event = self.env.event()
        self.arrived: dict[int, int] = {}
        self.arrival_event = self.env.event()
        self.counters = _Counters()
        self.start_snapshot: dict | None = None
        self.publish_times: list[float] = []
        self.finished = self.env.event()
        gpus = [simpy.Resource(self.env, capacity=1) for _ in range(layout.gen_gpus)]
        self.gens = [_Generator(self, gpu, layout.b_max, layout.t_max_ms) for gpu in gpus]
        if layout.placement == "colocated":
            self.train_gpus = gpus
        else:
            self.train_gpus = [simpy.Resource(self.env, capacity=1)]  # the DP group acts as one
        self.steps_per_rollout = SEGMENT_STEPS * SEGMENTS_PER_STEP
        # Lockstep envs stay in phase and reset together: measure whole episodes.
        episode_versions = math.ceil(profile.episode_steps / self.steps_per_rollout)
        self.measure_versions = DES_MEASURE_VERSIONS if layout.env_level else max(DES_MEASURE_VERSIONS, episode_versions)
        self.log_median = math.log(profile.step_ms)

    # -------------------------------------------------------- env step times
    def draw_max(self, rows: int, k: int) -> np.ndarray:
        if self.profile.step_sigma == 0:
            return np.full(rows, self.profile.step_ms)
        return self.rng.lognormal(self.log_median, self.profile.step_sigma, size=(rows, k)).max(axis=1)

    def reset_extra(self, t: int, phase: int = 0) -> float:
        """The step that ends an episode pays the reset (t counts a group's steps from 0; phase is
        how far into its episode the group started)."""
        return self.profile.reset_ms if (t + phase + 1) % self.profile.episode_steps == 0 else 0.0

    def measuring(self) -> bool:
        return self.start_snapshot is not None

    # -------------------------------------------------------- data and versions
    def deliver(self, step: int, samples: int) -> None:
        self.arrived[step] = self.arrived.get(step, 0) + samples
        if not self.arrival_event.triggered:
            self.arrival_event.succeed()

    def deliver_shard(self, step: int, samples: int):
        """A segment's shard reaches the Trainer shard_delay_ms after the segment ends."""
        yield self.env.timeout(self.profile.shard_delay_ms)
        self.deliver(step, samples)

    def record(self, step: int, version: int, samples: int, env_steps: int) -> None:
        if self.measuring():
            self.counters.stale_sum += (step - version) * samples
            self.counters.stale_n += samples
            self.counters.env_steps += env_steps

    def wait_version(self, needed: int):
        while self.version < needed:
            yield self.version_event

    def publish(self) -> None:
        self.version += 1
        self.granted = self.version + self.layout.gate_eta
        now = self.env.now
        self.publish_times.append(now)
        if self.version == DES_WARMUP_VERSIONS:
            self.start_snapshot = self.counters.snapshot()
        for g in self.gens:
            g.release()
        ev, self.version_event = self.version_event, self.env.event()
        ev.succeed()
        if self.version >= DES_WARMUP_VERSIONS + self.measure_versions and not self.finished.triggered:
            self.finished.succeed()

    # -------------------------------------------------------- processes
    def group(self, gid: int, gen: _Generator):
        """One env group: request, wait for actions, step (slowest env), deliver segments."""
        env, k = self.env, self.layout.group_size
        t, block, i = 0, self.draw_max(DES_DRAW_BLOCK, k), 0
        # Steady state: groups' episodes are out of phase (the engine starts them together, but
        # they drift apart within an episode or two); a short measurement then sees 1/L resets.
        phase = int(self.rng.integers(self.profile.episode_steps))
        while True:
            step = t // self.steps_per_rollout
            req = _Request(gid, k, step, env.now, env.event())
            gen.submit(req)
            version = yield req.done
            if i == len(block):
                block, i = self.draw_max(DES_DRAW_BLOCK, k), 0
            dt = float(block[i]) + self.reset_extra(t, phase)
            i += 1
            yield env.timeout(dt + self.profile.request_overhead_ms)
            self.counters.sim_busy += dt
            self.record(step, version, k, k)
            t += 1
            if t % SEGMENT_STEPS == 0:
                env.process(self.deliver_shard(step, k * SEGMENT_STEPS))

    def lockstep(self, gens: list[_Generator], groups: list[int]):
        """One coupled component of the engine's sync mode (`lockstep_components`): its
        Generators serve all their groups (B_max chunks, in parallel), then its envs step and
        the slowest ends the env step. Components run on their own between weight barriers."""
        env, lay = self.env, self.layout
        n_groups, envs = sum(groups), sum(groups) * lay.group_size
        t = 0
        while True:
            step = t // self.steps_per_rollout
            yield from self.wait_version(step - lay.gate_eta)
            version = self.version
            yield env.all_of([env.process(self._serve_chunks(g, _chunks([lay.group_size] * n, lay.b_max)))
                              for g, n in zip(gens, groups)])
            group_ms = self.draw_max(n_groups, lay.group_size) + self.reset_extra(t)
            dt = float(group_ms.max())
            yield env.timeout(dt + self.profile.request_overhead_ms)
            self.counters.sim_busy += float(group_ms.sum())
            self.record(step, version, envs, envs)
            t += 1
            if t % SEGMENT_STEPS == 0:
                env.process(self.deliver_shard(step, envs * SEGMENT_STEPS))

    def _serve_chunks(self, gen: _Generator, chunks: list[int]):
        for n in chunks:
            yield from gen.forward([_Request(-1, n, 0, 0.0, self.env.event())])

    def trainer(self):
        """Data-parallel Trainer: optimizer steps of global_batch samples (as they arrive when
        streaming, after the whole step otherwise), then the weight sync publishes k + 1."""
        env, lay, p = self.env, self.layout, self.profile
        R, GB = lay.rollout_batch, lay.global_batch
        opt_ms = GB / (p.train_samples_per_s * self.trainer_gpus) * MS_PER_S
        k = 0
        while True:
            for j in range(R // GB):
                need = (j + 1) * GB if lay.streaming else R
                while self.arrived.get(k, 0) < need:
                    self.arrival_event = env.event()
                    yield self.arrival_event
                yield from self._hold_gpus(opt_ms)
            yield from self._hold_gpus(p.weight_sync_ms)
            self.arrived.pop(k, None)
            k += 1
            self.publish()

    def _hold_gpus(self, ms: float):
        reqs = [gpu.request() for gpu in self.train_gpus]
        for r in reqs:
            yield r
        yield self.env.timeout(ms)
        self.counters.train_busy += ms
        for gpu, r in zip(self.train_gpus, reqs):
            gpu.release(r)


@dataclass(frozen=True)
class DesResult(Estimate):
    sim_ms: float = 0.0
    """Simulated time (ms)."""
    sliced: float = 1.0
    """Fraction of the Generators simulated (1 = all)."""


def simulate(profile: Profile, layout: Layout, seed: int = 0,
             max_generators: int = DES_MAX_GENERATORS) -> DesResult:
    """Discrete-event simulation (simpy) of the engine running `layout`; see `_Des`.

    Runs DES_WARMUP_VERSIONS + DES_MEASURE_VERSIONS rollout steps and measures between the
    publishes of the first and the last measured version: throughput is env steps completed in
    that window / its length (sync: whole cycles exactly); detail["consumed_steps_per_s"] is the
    Trainer's rate (rollout_batch x versions / window), which lags when the eta gate is loose."""
    scale, trainer_gpus, sim_layout = 1.0, float(layout.train_gpus), layout
    if layout.env_level and layout.placement == "disaggregated" and layout.gen_gpus > max_generators:
        scale = max_generators / layout.gen_gpus
        sim_layout = dataclasses.replace(layout, gen_gpus=max_generators)
        trainer_gpus = layout.train_gpus * scale
    des = _Des(profile, sim_layout, trainer_gpus, seed)
    env = des.env
    if sim_layout.env_level:
        gid = 0
        for gen in des.gens:
            env.process(gen.run())
            for _ in range(sim_layout.groups_per_gen):
                env.process(des.group(gid, gen))
                gid += 1
    else:
        gens = iter(des.gens)
        for comp in lockstep_components(profile, sim_layout):
            env.process(des.lockstep([next(gens) for _ in comp], comp))
    env.process(des.trainer())
    env.run(until=env.any_of([des.finished, env.timeout(DES_MAX_SIM_MS)]))
    return _des_result(des, sim_layout, scale)


def _des_result(des: _Des, lay: Layout, scale: float) -> DesResult:
    now = des.env.now
    if des.start_snapshot is None or len(des.publish_times) < DES_WARMUP_VERSIONS + 1:
        raise PlannerError(f"DES: only {len(des.publish_times)} versions published in {now / MS_PER_S:.0f} "
                           f"simulated s; the layout is too slow to measure (Trainer or rollout stalled)")
    t0 = des.publish_times[DES_WARMUP_VERSIONS - 1]
    t1 = des.publish_times[-1]
    versions = len(des.publish_times) - DES_WARMUP_VERSIONS
    consumed = lay.rollout_batch * versions / ((t1 - t0) / MS_PER_S)
    span = now - t0
    c, s = des.counters, des.start_snapshot
    thr = (c.env_steps - s["env_steps"]) / (span / MS_PER_S)
    n_groups = lay.num_envs // lay.group_size
    util = {
        "sim": (c.sim_busy - s["sim_busy"]) / (span * n_groups),
        "generator": (c.gen_busy - s["gen_busy"]) / (span * lay.gen_gpus),
        "trainer": (c.train_busy - s["train_busy"]) / span,
    }
    n = c.stale_n - s["stale_n"]
    stale = (c.stale_sum - s["stale_sum"]) / n if n else float("nan")
    detail = {"versions": versions, "consumed_steps_per_s": consumed / scale}
    return DesResult(thr / scale, "des", util, stale, detail, sim_ms=now, sliced=scale)


# ---------------------------------------------------------------- plan


@dataclass(frozen=True)
class Scored:
    layout: Layout
    analytic: Estimate
    des: DesResult | None = None

    @property
    def best_estimate(self) -> float:
        return self.des.steps_per_s if self.des is not None else self.analytic.steps_per_s


@dataclass(frozen=True)
class Plan:
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
    _check(gpus >= 2, "gpus", gpus, "need at least 2 GPUs (one Generator, one Trainer)")
    n = profile.gpus_per_node
    _check(gpus <= n or gpus % n == 0, "gpus", gpus,
           f"must fill whole GPU nodes of profile.gpus_per_node={n} (or fit in one)")


def env_budget(profile: Profile, cpu_cores: int) -> int:
    n = int(cpu_cores // profile.cores_per_env)
    _check(n >= 1, "cpu_cores", cpu_cores, f"holds no env at profile.cores_per_env={profile.cores_per_env}")
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
    _check(e >= k, "cpu_cores", max_envs, f"too few envs for {gen} Generators with groups of {k}")
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
    scored = [Scored(l, analytic(profile, l)) for l in layouts]
    return max(scored, key=lambda s: s.analytic.steps_per_s)


def plan(profile: Profile, gpus: int, cpu_cores: int | None = None, des_checks: int = DES_CHECKS,
         seed: int = 0) -> Plan:
    """Search async layouts with the analytic model, re-check the best few with the DES.

    The CPU budget (default CPU_CORES_PER_GPU per GPU) bounds the envs; the answer is the
    Generator/Trainer split, envs per Generator (the env-to-GPU ratio), group size, B_max,
    T_max and eta. The returned sync baselines and naive split are scored the same way."""
    check_gpus(profile, gpus)
    cpu_cores = CPU_CORES_PER_GPU * gpus if cpu_cores is None else cpu_cores
    max_envs = env_budget(profile, cpu_cores)
    scored = [Scored(l, analytic(profile, l)) for l in async_candidates(profile, gpus, max_envs)]
    _check(bool(scored), "gpus", gpus, f"no valid layout with {max_envs} envs")
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
    return Plan(profile, gpus, cpu_cores, checked[0], tuple(checked), _best_analytic(profile, colo),
                _best_analytic(profile, dis), Scored(naive, analytic(profile, naive)), len(scored))


# ---------------------------------------------------------------- the ablation ladder


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


# ---------------------------------------------------------------- Hydra overrides


def run_overrides(layout: Layout, sharding: list[list[int]]) -> dict:
    """The engine settings of `layout` (envs, sharding, batch sizes, batcher, mode switches)."""
    out = {
        "env": {"num_envs": layout.num_envs},
        "sharding": {"plan": sharding},
        "algo": {"rollout_batch": layout.rollout_batch, "global_batch": layout.global_batch,
                 "micro_batch": min(MICRO_BATCH, layout.global_batch), "segment_steps": SEGMENT_STEPS},
        "generator": {"b_max": layout.b_max, "t_max_ms": float(layout.t_max_ms)},
        "mode": {"env_level": layout.env_level, "overlap": layout.overlap, "streaming": layout.streaming,
                 "eta": layout.eta, "placement": layout.placement},
    }
    if layout.b_max > PolicyConfig().max_batch:
        out["policy"] = {"max_batch": layout.b_max}
    return out


def overrides(profile: Profile, layout: Layout, name: str) -> dict:
    """The cluster config the launcher accepts for `layout` (same keys as conf/cluster/slurm_*.yaml;
    partitions are placeholders that conf/site/local.yaml overrides)."""
    plan = sharding_plan(profile, layout)
    cluster = {
        "cluster": {
            "name": name,
            "sim_ranks": len(plan),
            "gen_ranks": layout.gen_gpus,
            "train_ranks": layout.train_gpus,
            "gpus_per_node": profile.gpus_per_node,
            "cores_per_gpu_node": CORES_PER_GPU_NODE,
            "cores_per_cpu_node": profile.cores_per_cpu_node,
            "cpus_per_sim_rank": CPUS_PER_SIM_RANK,
            "cpus_per_gpu_rank": CPUS_PER_GPU_RANK,
            "cpu_partition": "cpu",
            "gpu_partition": "gpu",
            "time": "04:00:00",
        },
    }
    return {**cluster, **run_overrides(layout, plan)}


def emulation_overrides(profile: Profile) -> dict:
    """env=emulated policy=emulated settings that make the engine pay `profile`'s costs."""
    return {
        "env": {"name": "emulated", "step_ms": profile.step_ms, "step_sigma": profile.step_sigma,
                "reset_ms": profile.reset_ms, "horizon": profile.episode_steps},
        "policy": {"name": "emulated", "infer_fixed_ms": profile.infer_fixed_ms,
                   "infer_per_sample_ms": profile.infer_per_sample_ms, "max_batch": profile.max_batch,
                   "train_samples_per_s": profile.train_samples_per_s, "weight_sync_ms": profile.weight_sync_ms},
    }


def override_strings(tree: dict) -> list[str]:
    """Hydra command-line overrides (key.path=value) for a nested overrides dict."""
    out = []

    def walk(prefix: str, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(node, list):
            out.append(f"{prefix}={_hydra_value(node)}")
        else:
            out.append(f"{prefix}={_hydra_value(node)}")

    walk("", tree)
    return out


def _hydra_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    if isinstance(v, str):
        return f"'{v}'" if ":" in v else v
    return repr(v)


def overrides_yaml(tree: dict, header: str) -> str:
    """The cluster file text: a Hydra _global_ package selecting the project's Slurm launcher."""
    import yaml

    body = yaml.safe_dump(tree, sort_keys=False, default_flow_style=None, width=100)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return ("# @package _global_\n" + comment +
            "defaults:\n  - override /hydra/launcher: rlvla3_slurm\n" + body)
