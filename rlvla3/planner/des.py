"""The discrete-event simulation (simpy) of what the engine does: env groups as processes,
Generators with the engine's own batching rule (`engine.batcher.DynamicBatcher`) and the eta
credit gate, a data-parallel Trainer that publishes versions. Slower than the analytic model, but
it has the effects that one averages away (heavy-tailed steps, pipeline drain at rollout-step
boundaries, staleness)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..engine.batcher import DynamicBatcher
from .analytic import Estimate, _chunks, forward_ms
from .layout import SEGMENT_STEPS, SEGMENTS_PER_STEP, Layout, lockstep_components
from .network import effective
from .profile import MS_PER_S, PlannerError, Profile

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
    profile = effective(profile, layout)   # the site's network and filesystem, as engine costs
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
