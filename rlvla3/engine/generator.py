"""Generator role: serves action requests from many env groups with a dynamic batcher.

Loop (each pass does only what is ready; see `step`):
  1. apply new weights between batches (version, and credits: the last rollout step it may serve);
  2. receive OBS requests; an ACT request for a rollout step beyond the credits waits (this is
     what bounds staleness: a sample for step k is produced by a version >= k - eta);
  3. the batcher closes a batch at B_max samples or T_max after the batch's first request;
  4. forward the policy; reply the action chunk, the policy's sample (token ids or denoising
     chain), logprob, value and the producing version.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..config import RunConfig
from ..policies import make_actor
from ..policies.sampling import draw_noise, greedy_noise
from ..world import World, spec
from . import weights
from .batcher import DynamicBatcher, WindowTuner
from .doorbell import Cadence, earliest
from .obs_compression import obs_wire
from .protocol import Done, Kind, Stop, Tag, WeightsHeader, action_codec, obs_codec


@dataclass
class Request:
    gid: int
    n: int                 # samples (envs in the group)
    arrived: float         # monotonic time it became eligible for batching
    request_id: int        # the group's request number (protocol.request_id): keys the noise
    step: int              # the rollout step it is for (ACT requests need a credit for it)
    kind: int
    obs: dict              # views into the group's receive buffer


class Generator:
    def __init__(self, cfg: RunConfig, world: World, transport, metrics, gen_index: int):
        self.cfg, self.world, self.transport, self.metrics = cfg, world, transport, metrics
        self.sp = spec(cfg)
        self.actor = make_actor(cfg, self.sp)   # torch policy, or an emulated one (no torch)
        self.obs_codec, self.act_codec = obs_codec(self.sp), action_codec(self.sp)
        self.groups = {g.gid: g for g in world.groups_of_gen(gen_index)}
        self.recv_bufs = {gid: self.obs_codec.alloc(g.size) for gid, g in self.groups.items()}
        self.wires = {gid: obs_wire(cfg, self.obs_codec, g.size) for gid, g in self.groups.items()}   # None: raw
        self.reply_bufs = {gid: self.act_codec.alloc(g.size) for gid, g in self.groups.items()}
        self.reply_reqs: dict[int, object] = {}
        self.busy: set[int] = set()            # groups with a request received and not yet answered
        self.cadence = {gid: Cadence() for gid in self.groups}   # each group's interval between requests
        self.last_arrival: dict[int, float] = {}
        self.expect_most = cfg.runtime.expect_spin_us / 1e6   # seconds either side of a due request
        self.held: list[Request] = []          # ACT requests beyond the credits
        # Sync baseline (lockstep): wait for every group served, then forward them all in B_max
        # chunks; async: the dynamic batcher closes batches on B_max or T_max.
        self.lockstep = world.lockstep
        self.served = sum(g.size for g in self.groups.values())
        self.round_left = 0   # lockstep: samples of the current round not yet served
        self.batcher = DynamicBatcher(world.b_max, float("inf") if self.lockstep else cfg.generator.t_max_ms / 1e3)
        # At most `served` samples can ever be waiting (each group has one request in flight): a
        # larger target would only push the window to its cap, so the target is capped there.
        adapt = cfg.generator.adapt_batch and not self.lockstep
        target = min(cfg.generator.adapt_batch, self.served)
        self.tuner = WindowTuner(target, cfg.generator.t_max_ms / 1e3) if adapt else None
        self.version, self.granted_until = -1, -1
        # Two buffers: the model serves from one (on a CPU its parameters are views of it) while
        # the next version lands in the other; they swap when it is all here.
        self.weights_buf = np.zeros(self.actor.n_params, np.float32)
        self.next_buf = np.zeros(self.actor.n_params, np.float32)
        self.bf16_wire: np.ndarray | None = None   # where bfloat16 buckets land before decoding
        self.incoming: tuple[WeightsHeader, weights.Incoming] | None = None
        self.sims = sorted({g.sim_rank for g in self.groups.values()})
        self.trainer0 = world.train_ranks[0]
        self.weights_from = world.relay_parent(transport.rank)   # Trainer 0, or a Generator of the relay tree
        self.weights_to = world.relay_children(transport.rank)
        self.stopped = False
        self.done = False
        self.batches = 0

    # ------------------------------------------------------------ weights
    def set_weights(self, flat: np.ndarray, version: int, granted_until: int) -> None:
        with self.metrics.timed("weight_sync", version=version):
            self.actor.load(flat)
        self.version, self.granted_until = version, granted_until
        self._release_held()

    def _poll_weights(self) -> bool:
        """A new version from this Generator's parent in the relay tree (Trainer 0 or a Generator; a
        colocated Trainer 0's arrives in-process, on the same edge), received beside serving and
        forwarded to its children; the model swaps to it between batches, once it is all here."""
        if self.incoming is not None:
            return self._progress_incoming()
        got = self.transport.poll(Tag.WEIGHTS, self.weights_from)
        if got is None:
            return False
        hdr: WeightsHeader = got[1]
        if hdr.n_params != self.weights_buf.size:
            raise RuntimeError(f"weights of version {hdr.version} have {hdr.n_params} values, this Generator's "
                               f"model has {self.weights_buf.size}: Trainer and Generator built different models")
        if hdr.dtype == "float32":
            wire = self.next_buf
        else:
            if self.bf16_wire is None:
                self.bf16_wire = weights.wire_buffer(self.next_buf, hdr.dtype)
            wire = self.bf16_wire
        for child in self.weights_to:
            self.transport.send(child, Tag.WEIGHTS, hdr)
        self.incoming = (hdr, weights.Incoming(self.transport, self.weights_from, wire, self.next_buf, hdr.bucket_mb,
                                               self.cfg.runtime.liveness_timeout, self.weights_to))
        self._progress_incoming()
        return True

    def _progress_incoming(self) -> bool:
        hdr, incoming = self.incoming
        landed = incoming.landed
        if not incoming.progress():
            return incoming.landed > landed   # a bucket landed: work (the loop looks again at once)
        self.incoming = None
        self.metrics.span("comm", incoming.t0, time.time() - incoming.t0, what="weights", bytes=incoming.wire.nbytes)
        self.weights_buf, self.next_buf = self.next_buf, self.weights_buf
        self.set_weights(self.weights_buf, hdr.version, hdr.granted_until)
        return True

    # ------------------------------------------------------------ requests
    def _poll_requests(self) -> bool:
        work = False
        for gid, g in self.groups.items():
            if gid in self.busy or g.sim_rank in self.transport.done_ranks:
                continue
            buf = self.recv_bufs[gid]
            if not self._receive_obs(g, buf):
                continue
            work = True
            if self.stopped:
                continue  # draining after Stop: the Simulator no longer waits for a reply
            _, rid, step, kind = self.obs_codec.header(buf)
            req = Request(gid, g.size, time.monotonic(), rid, step, kind, self.obs_codec.unpack(buf, g.size))
            if gid in self.last_arrival:
                self.cadence[gid].observe(req.arrived - self.last_arrival[gid])
            self.last_arrival[gid] = req.arrived
            self.busy.add(gid)
            self._tune(req)
            self._admit(req)
        return work

    def _receive_obs(self, g, buf: np.ndarray) -> bool:
        """A group's waiting request into `buf` (decompressed with runtime.obs_compression)."""
        wire = self.wires[g.gid]
        if wire is None:
            return self.transport.recv_buf_now(g.sim_rank, Tag.OBS + g.gid, buf)
        got = self.transport.recv_bytes_now(g.sim_rank, Tag.OBS + g.gid, wire.wire)
        if got is None:
            return False
        wire.decode(got, buf)
        return True

    def _admit(self, req: Request) -> None:
        if req.kind == Kind.BOOTSTRAP or req.step <= self.granted_until:
            self.batcher.add(req)
        else:
            self.held.append(req)

    def _tune(self, req: Request) -> None:
        """Online batching window: follow the arrival rate (generator.adapt_batch)."""
        if self.tuner is not None and self.tuner.observe(req.arrived, req.n):
            self.batcher.t_max = self.tuner.window
            self.metrics.scalar("t_max_ms", self.tuner.window * 1e3, rate=self.tuner.rate)

    def _release_held(self) -> None:
        held, self.held = self.held, []
        now = time.monotonic()
        for req in held:
            req.arrived = now  # its batch clock starts when it becomes servable
            self._admit(req)

    # ------------------------------------------------------------ inference
    def _batch_ready(self) -> bool:
        if not self.lockstep:
            return self.batcher.ready(time.monotonic())
        # A round starts when every group's request is in, and ends when exactly the admitted
        # ones are served: a group served early may already be queued for the next round, and
        # serving it now would let its Simulator run a step ahead (and, at a credit boundary,
        # deadlock: its next request held, the others' round never complete). Held requests
        # count as in but sit the round out: after a resume that left groups a segment apart
        # across a step boundary, the group behind must finish the step that earns the credits.
        held = sum(r.n for r in self.held)
        if self.round_left == 0 and self.batcher.samples and self.batcher.samples + held >= self.served:
            self.round_left = self.batcher.samples
        return self.round_left > 0

    def _serve_batch(self) -> None:
        wait = time.monotonic() - self.batcher.queue[0].arrived
        batch = self.batcher.pop(self.round_left if self.lockstep else None)
        n = sum(r.n for r in batch)
        if self.lockstep:
            self.round_left -= n
        t0 = time.time()
        p0 = time.perf_counter()
        obs = {k: np.concatenate([r.obs[k] for r in batch]) for k in ("images", "proprio", "tokens")}
        sample, logp, value = self.actor.act(obs, np.concatenate([self._noise(r) for r in batch]))
        dt = time.perf_counter() - p0
        i = 0
        for r in batch:
            self._reply(r, sample[i:i + r.n], logp[i:i + r.n], value[i:i + r.n])
            i += r.n
        self.metrics.span("infer", t0, dt, batch=n, requests=len(batch), version=self.version)   # after the replies left
        self.metrics.span("batch_wait", t0 - wait, wait, batch=n)
        self.batches += 1

    def _noise(self, r: Request) -> np.ndarray:
        """The policy's sampling noise (U(0,1) for Gumbel-max over tokens, N(0,1) for a denoising
        chain), keyed by (seed, group, request): a sample never depends on its batch. With
        generator.greedy, the noise of the most likely action."""
        rng = np.random.Generator(np.random.Philox(key=[self.cfg.seed, r.gid * 2**32 + r.request_id]))
        noise = draw_noise(self.sp.sample, rng, r.n)
        return greedy_noise(self.sp.sample, noise) if self.cfg.generator.greedy else noise

    def _reply(self, r: Request, sample, logp, value) -> None:
        g = self.groups[r.gid]
        buf = self.reply_bufs[r.gid]
        prev = self.reply_reqs.get(r.gid)
        if prev is not None:
            self.transport.wait(prev, self.cfg.runtime.liveness_timeout, g.sim_rank, "action reply")
        self.act_codec.pack(buf, (r.gid, r.request_id, self.version, r.kind), {
            "action": self.actor.to_env_action(sample), "sample": sample, "logprob": logp, "value": value})
        self.reply_reqs[r.gid] = self.transport.isend_buf(g.sim_rank, Tag.ACTION + r.gid, buf)
        self.busy.discard(r.gid)

    def wake_fds(self) -> tuple:
        return ()   # everything this role waits for comes by MPI (and rings the doorbell)

    def deadline(self) -> float | None:
        """When the open batch closes on T_max (monotonic), if one is open; while a version is
        arriving, soon (its buckets land only as this rank looks)."""
        batch = None if self.lockstep else self.batcher.deadline()
        if self.incoming is None:
            return batch
        return min(t for t in (batch, time.monotonic() + self.cfg.runtime.idle_sleep) if t is not None)

    def expecting(self) -> tuple[float, float] | None:
        """When the next request of a group with none in hand is due (monotonic window)."""
        return earliest((self.cadence[gid].window(t, self.expect_most) for gid, t in self.last_arrival.items()
                         if gid not in self.busy), time.monotonic())

    def describe(self) -> str:
        return (f"generator version {self.version} credits<=step {self.granted_until}: batcher "
                f"{self.batcher.samples}/{self.batcher.b_max} samples, held {[(r.gid, r.step) for r in self.held]}, "
                f"busy groups {sorted(self.busy)}")

    # ------------------------------------------------------------ loop
    def step(self) -> bool:
        if self.done:
            return False
        work = self._poll_weights()
        work |= self._poll_requests()
        if self._batch_ready():
            self._serve_batch()
            work = True
        self._poll_control()
        return work

    def _poll_control(self) -> None:
        # A version still arriving is received (and relayed) in full first: its children wait for it.
        got = self.transport.poll(Tag.STOP) if self.incoming is None else None
        if got is not None:
            for child in self.weights_to:   # after every publish it relayed: those have completed
                self.transport.send(child, Tag.STOP, got[1])
            self.stop(got[1])
        self.transport.poll_done()
        if self.stopped and set(self.sims) <= self.transport.done_ranks and not self.done:
            for req in self.reply_reqs.values():
                if not req.Test():
                    req.Cancel()
            self.transport.send(self.trainer0, Tag.DONE, Done(self.transport.rank, "generator"))
            self.done = True

    def stop(self, msg: Stop) -> None:
        """Stop serving; keep receiving (and dropping) requests until every Simulator is done."""
        self.stopped = True
        self.round_left = 0
        self.batcher.queue.clear()
        self.batcher.samples = 0
        self.held.clear()
        self.busy.clear()
