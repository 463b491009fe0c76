"""The analytic bottleneck model: steady-state env steps/s of a layout is the minimum of the stage
capacities (Simulator groups, Generators, Trainer), with sync mode's serialisation (rollout,
then train, then weight sync). Microseconds per call, so the search can score thousands."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .layout import SEGMENT_STEPS, SEGMENTS_PER_STEP, Layout, lockstep_components
from .network import effective
from .profile import MS_PER_S, Profile, require

LOGNORMAL_GRID = 4001
"""Grid points of the numerical integral for E[max of n log-normals]."""
GPU_SATURATED = 0.98
"""A Generator busy this fraction of the time is reported as the bottleneck."""
FIXED_POINT_ITERS = 200
FIXED_POINT_TOL = 1e-9



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
    profile = effective(profile, layout)   # the site's network and filesystem, as engine costs
    R = layout.rollout_batch
    train_s = R / (profile.train_samples_per_s * layout.train_gpus)
    sync_s = profile.weight_sync_ms / MS_PER_S
    shard_s = profile.shard_delay_ms / MS_PER_S   # the last shard of a step reaches the Trainer late
    gb_train_s = layout.global_batch / (profile.train_samples_per_s * layout.train_gpus)
    if layout.env_level:
        require(layout.placement == "disaggregated", "layout.placement", layout.placement,
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
        require(not layout.overlap, "layout.overlap", layout.overlap,
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
