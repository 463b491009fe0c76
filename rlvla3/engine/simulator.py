"""Simulator role: hosts env groups, asks Generators for actions, writes trajectory shards.

Imports numpy, mpi4py and zarr only — never torch (Simulator ranks sit on CPU nodes).

Each group runs its own loop, advanced without blocking so that several groups on one rank
overlap simulation with inference:

    obs ready -> OBS request (ACT) -> wait for its ACTION reply -> step envs (maybe in child processes)
      -> record transition -> after `segment_steps` steps: an OBS request (BOOTSTRAP) for V(s_T)
      -> write the segment as a shard (atomic) -> ShardReady to every Trainer -> next segment.

Segment `seq` of a group belongs to rollout step `seq // segments_per_step`; the Generator
serves it only once the Trainer has granted credits up to that step (bounded staleness).
With `mode.env_level` off, the groups of a rank advance in lockstep (the sync baseline).

Episodic mode (grpo and evaluation, `World.episodic`): a segment holds whole episodes. At each
segment start the group resets all its envs (grpo training: with one shared seed, so one GRPO
group = one initial state; evaluation: each env from its own seeds); an env whose episode ended
records invalid rows until the segment ends; no bootstrap value is needed. Once all of a group's
episodes have ended, the rest of the segment is padded with invalid rows at once (env_level only:
lockstep groups take every step together).
"""
from __future__ import annotations

import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from ..config import RunConfig
from ..envs.hosting import GroupStep, make_vec_env
from ..envs.libero_env import episode_of
from ..policies.prompts import instruction_encoder
from ..world import Group, World, group_seed, spec
from . import checkpoints, shards
from .curriculum import TaskCurriculum
from .doorbell import Cadence, earliest
from .obs_compression import obs_wire
from .protocol import Done, Kind, ShardReady, Stop, Tag, action_codec, obs_codec, request_id


class GroupState(Enum):
    """Where one env group is in its loop."""

    RESETTING = "resetting"            # envs resetting (segment start in episodic mode, or start-up)
    SEND = "send"                      # the next observation is ready: ask for an action
    WAIT_ACTION = "wait_action"        # an ACT request is out
    STEPPING = "stepping"              # the envs execute the action chunk
    WAIT_BOOTSTRAP = "wait_bootstrap"  # the segment's last V(s_T) request is out


RESETTING, SEND, WAIT_ACTION, STEPPING, WAIT_BOOTSTRAP = GroupState


@dataclass
class SegmentBuffer:
    """Time-major arrays of one segment being recorded ([T, N, ...]), and each env's instruction
    text where it changes (`texts[n]`: [row, text] pairs; the shard's `instructions` attribute),
    which the tokens encode but cannot always give back (a hashed vocabulary is one way)."""

    arrays: dict[str, np.ndarray]
    texts: list[list] = field(default_factory=list)

    def note_texts(self, t: int, texts: list[str]) -> None:
        """Row t was decided under these instructions (one per env)."""
        if not self.texts:
            self.texts = [[] for _ in texts]
        for mine, text in zip(self.texts, texts):
            if not mine or mine[-1][1] != text:
                mine.append([t, text])

    @classmethod
    def allocate(cls, T: int, n: int, sp) -> "SegmentBuffer":
        z = np.zeros
        return cls({
            "images": z((T, n, sp.cameras, sp.image_size, sp.image_size, 3), np.uint8),
            "proprio": z((T, n, sp.proprio_dim), np.float32),
            "tokens": z((T, n, sp.instruction_len), np.int32),
            "sample": z((T, n, *sp.sample.shape), sp.sample.dtype),
            "actions": z((T, n, sp.chunk, sp.action_dim), np.float32),
            "logprobs": z((T, n), np.float32),
            "values": z((T, n), np.float32),
            "rewards": z((T, n), np.float32),
            "terminated": z((T, n), bool),
            "truncated": z((T, n), bool),
            "success": z((T, n), bool),
            "env_steps": z((T, n), np.int16),
            "valid": z((T, n), bool),
            "versions": z((T, n), np.int32),
        })


@dataclass
class FinishedSegment:
    """A group's complete segment, as `GroupLoop.advance` hands it back: what its shard holds."""

    seq: int
    step_index: int
    buffer: SegmentBuffer
    bootstrap: np.ndarray
    stats: dict
    reset_digests: list[int] | None = None   # episodic: each env's initial observation
    reset_seeds: list[int] | None = None     # episodic: each env's seed of the segment's episode


@dataclass
class RankContext:
    """What the groups of one Simulator rank share, and all a group reads of its rank."""

    cfg: RunConfig
    world: World
    spec: object
    transport: object
    metrics: object
    encode: object           # the instruction encoder (one tokenizer per rank)
    obs_codec: object
    act_codec: object
    expect_most: float       # seconds either side of a due reply (runtime.expect_spin_us)
    tasks: TaskCurriculum | None = None   # a multi-task LIBERO run: per-task outcomes, the next task (curriculum.py)


def new_stats() -> dict:
    """A segment's rollout statistics (ShardReady's fields); task_stats: task -> [episodes, successes]."""
    return {"episodes": 0, "successes": 0, "return_sum": 0.0, "env_errors": 0, "task_stats": {}}


def task_curriculum(cfg: RunConfig) -> TaskCurriculum | None:
    """A LIBERO run over several tasks records each task's outcomes (and, with
    env.task_sampling=failure, draws its groups' tasks from them); None otherwise."""
    e = cfg.env
    if e.name != "libero" or len(e.task_ids) < 2:
        return None
    return TaskCurriculum(list(e.task_ids), e.task_sampling, e.task_sampling_floor, e.task_sampling_window)


def segment_meta(cfg: RunConfig, world: World, g: Group, seq: int, rank: int) -> tuple[str, dict]:
    """The shard name and attributes of group `g`'s segment `seq` (rollouts and demonstrations)."""
    step = seq // world.segments_per_step
    return shards.shard_name(step, g.gid, seq), {
        "producer_rank": rank, "group": g.gid, "seq": seq, "step": step,
        "env_ids": list(range(g.env_offset, g.env_offset + g.size)), "env": cfg.env.name, "task": cfg.env.task}


def obs_digest(images: np.ndarray, proprio: np.ndarray) -> int:
    """crc32 of one observation: equal digests = the same initial state (grpo's check)."""
    return zlib.crc32(proprio.astype(np.float32).tobytes(), zlib.crc32(np.ascontiguousarray(images).tobytes()))


class GroupLoop:
    """One env group's state machine. `advance` returns each segment as it completes; the rank
    writes and announces it."""

    def __init__(self, ctx: RankContext, g: Group, first_seq: int):
        self.ctx, self.g = ctx, g
        cfg, sp = ctx.cfg, ctx.spec
        self.gen_rank = ctx.world.gen_rank_of(g)
        self.env = make_vec_env(cfg, list(range(g.env_offset, g.env_offset + g.size)), cfg.seed,
                                auto_reset=not ctx.world.episodic, encode=ctx.encode)
        self.T = cfg.algo.segment_steps
        self.seg = SegmentBuffer.allocate(self.T, g.size, sp)
        self.obs_buf = ctx.obs_codec.alloc(g.size)
        self.wire = obs_wire(cfg, ctx.obs_codec, g.size)   # None: the buffer travels as it is
        self.reply_buf = ctx.act_codec.alloc(g.size)
        self.cur = {"images": None, "proprio": None, "tokens": None}
        self.cur_texts: list[str] = []               # the instructions the tokens of `cur` encode
        self.seq, self.t = first_seq, 0
        self.ret = np.zeros(g.size, np.float32)      # running episode return per env
        self.stats = new_stats()
        self.episode_seeds = np.full(g.size, -1, np.int64)   # each env's current episode's reset seed
        self.send_req = self.recv_req = None
        self.t_sent = 0.0
        self.sent_at = 0.0                           # monotonic twin of t_sent
        self.round_trip = Cadence()                  # from a request to its reply
        self.episodic = ctx.world.episodic
        self.alive = np.ones(g.size, bool)           # episodic: envs still in their episode
        self.reset_digests: list[int] = []
        self.reset_seeds: list[int] = []     # episodic: each env's seed of the segment's episode
        self.state = RESETTING
        self._start_reset()

    @property
    def step_index(self) -> int:
        return self.seq // self.ctx.world.segments_per_step

    @property
    def position(self) -> tuple[int, int]:
        """(segment, time index) of this group's current or next request."""
        return self.seq, self.t

    # ------------------------------------------------------------ transitions
    def advance(self, may_send: bool) -> tuple[bool, FinishedSegment | None]:
        """Do whatever this group can do now without blocking: (whether it did work, the segment
        it completed, if it did)."""
        if self.state in (RESETTING, STEPPING):
            if not self.env.ready():
                return False, None
            return True, self._on_env_result(self.env.result())
        if self.state == SEND and may_send:
            self._send_request(Kind.ACT)
            return True, None
        if self.state in (WAIT_ACTION, WAIT_BOOTSTRAP) and self.recv_req.Test():
            waited = time.time() - self.t_sent
            self.round_trip.observe(time.monotonic() - self.sent_at)
            self.ctx.transport.seen(self.gen_rank)
            finished = None
            if self.state == WAIT_ACTION:
                self._on_action()
            else:
                finished = self._on_bootstrap()
            self.ctx.metrics.span("wait_action", self.t_sent, waited, gid=self.g.gid)   # once the envs are stepping
            return True, finished
        return False, None

    def deadline(self) -> float | None:
        return self.env.deadline() if self.state in (RESETTING, STEPPING) else None

    def wake_fds(self) -> tuple:
        return self.env.wake_fds() if self.state in (RESETTING, STEPPING) else ()

    def expecting(self) -> tuple[float, float] | None:
        """When the reply to the request out is due (monotonic window), if one is out."""
        if self.state not in (WAIT_ACTION, WAIT_BOOTSTRAP):
            return None
        return self.round_trip.window(self.sent_at, self.ctx.expect_most)

    def _start_reset(self) -> None:
        """`World.shared_reset`: every env of the group from one seed; else each env's own seeds."""
        self.alive[:] = True
        shared = self.ctx.world.shared_reset
        seed = group_seed(self.ctx.cfg, self.g.gid, self.seq) if shared else None
        if seed is not None and self.ctx.tasks is not None:
            seed = self.ctx.tasks.seed_for(seed)   # env.task_sampling: the group's task
        self.env.start_reset(seed)

    def _send_request(self, kind: Kind) -> None:
        if self.send_req is not None:
            self.ctx.transport.wait(self.send_req, self.ctx.cfg.runtime.liveness_timeout, self.gen_rank, "obs send")
        header = (self.g.gid, request_id(self.seq, self.t, self.T), self.step_index, int(kind))
        self.ctx.obs_codec.pack(self.obs_buf, header, self.cur)
        self.recv_req = self.ctx.transport.irecv_buf(self.gen_rank, Tag.ACTION + self.g.gid, self.reply_buf)
        data = self.obs_buf if self.wire is None else self.wire.encode(self.obs_buf)
        self.send_req = self.ctx.transport.isend_buf(self.gen_rank, Tag.OBS + self.g.gid, data)
        self.t_sent, self.sent_at = time.time(), time.monotonic()
        self.state = WAIT_ACTION if kind == Kind.ACT else WAIT_BOOTSTRAP

    def _on_action(self) -> None:
        r = self.ctx.act_codec.unpack(self.reply_buf, self.g.size)
        version = self.ctx.act_codec.header(self.reply_buf)[2]
        s, t = self.seg.arrays, self.t
        for k in ("images", "proprio", "tokens"):
            s[k][t] = self.cur[k]
        self.seg.note_texts(t, self.cur_texts)
        s["sample"][t] = r["sample"]
        s["actions"][t] = r["action"]
        s["valid"][t] = self.alive
        s["logprobs"][t] = r["logprob"]
        s["values"][t] = r["value"]
        s["versions"][t] = version
        self.env.start_step(r["action"][:, :self.ctx.world.execute_steps].copy())   # a receding horizon
        self.state = STEPPING

    def _on_env_result(self, out: GroupStep) -> FinishedSegment | None:
        m = self.ctx.metrics
        if self.state == STEPPING:
            s, t = self.seg.arrays, self.t
            s["rewards"][t], s["terminated"][t], s["truncated"][t], s["success"][t], s["env_steps"][t] = (
                out.reward, out.terminated, out.truncated, out.success, out.env_steps)
            if self.episodic:
                self.alive &= ~(out.terminated | out.truncated)
            m.span("sim_step", time.time() - out.step_s, out.step_s, gid=self.g.gid, envs=self.g.size)
            if out.reset_s:
                m.span("reset", time.time(), out.reset_s, gid=self.g.gid)
            self._count_episodes(out)
            self.t += 1
            if self.episodic and not self.alive.any() and not self.ctx.world.lockstep:
                self._pad_segment()
        started = out.reset_seeds >= 0
        self.episode_seeds[started] = out.reset_seeds[started]
        self.cur = {"images": out.images, "proprio": out.proprio, "tokens": out.tokens}
        self.cur_texts = out.instructions
        if self.state == RESETTING and self.episodic:
            self.reset_digests = [obs_digest(out.images[i], out.proprio[i]) for i in range(self.g.size)]
            self.reset_seeds = out.reset_seeds.tolist()
        if self.state == STEPPING and self.t == self.T:
            if self.episodic:   # every episode ended within the segment: nothing to bootstrap
                return self._end_segment(np.zeros(self.g.size, np.float32))
            self._send_request(Kind.BOOTSTRAP)
        else:
            self.state = SEND
        return None

    def _pad_segment(self) -> None:
        """Episodic: every episode of the group has ended, so the rest of the segment would only
        be invalid rows. Write them now (valid=False, the last row's version, so the Trainer
        neither trains nor re-evaluates them) instead of asking the Generator for actions no env
        executes; the next reset starts at once. Only with env_level: in lockstep (sync) every
        group of a rank takes every step together, and a group running ahead into the next
        rollout step would leave the others' batches waiting for it."""
        s, t = self.seg.arrays, self.t
        s["versions"][t:] = s["versions"][t - 1]
        s["valid"][t:] = False
        self.t = self.T

    def _count_episodes(self, out: GroupStep) -> None:
        self.ret += out.reward
        ended = out.terminated | out.truncated
        st = self.stats
        st["episodes"] += int(ended.sum())
        st["successes"] += int((out.success & ended).sum())
        st["return_sum"] += float(self.ret[ended].sum())
        st["env_errors"] += out.errors
        self.ret[ended] = 0.0
        if self.ctx.tasks is not None:   # before the step's resets overwrite the ended episodes' seeds
            for i in np.flatnonzero(ended):
                task = episode_of(int(self.episode_seeds[i]), self.ctx.tasks.task_ids)[0]
                self.ctx.tasks.record(task, bool(out.success[i]))
                counts = st["task_stats"].setdefault(task, [0, 0])
                counts[0] += 1
                counts[1] += int(out.success[i])

    def _on_bootstrap(self) -> FinishedSegment:
        return self._end_segment(self.ctx.act_codec.unpack(self.reply_buf, self.g.size)["value"].copy())

    def _end_segment(self, bootstrap: np.ndarray) -> FinishedSegment:
        """The segment as it stands, handed back; the group records the next into a fresh buffer."""
        done = FinishedSegment(self.seq, self.step_index, self.seg, bootstrap, self.stats)
        if self.episodic:
            done.reset_digests, done.reset_seeds = self.reset_digests, self.reset_seeds
        self.seg = SegmentBuffer.allocate(self.T, self.g.size, self.ctx.spec)
        self.seq += 1
        self.t = 0
        self.stats = new_stats()
        if self.episodic:
            self.state = RESETTING
            self._start_reset()
        else:
            self.state = SEND
        return done

    def cancel(self) -> None:
        """At shutdown: drop a pending reply receive (the Generator stops answering)."""
        if self.state in (WAIT_ACTION, WAIT_BOOTSTRAP) and self.recv_req is not None and not self.recv_req.Test():
            self.recv_req.Cancel()
            self.recv_req.Wait()


class Simulator:
    def __init__(self, cfg: RunConfig, world: World, transport, metrics, run_dir: Path):
        self.cfg, self.world, self.transport, self.metrics = cfg, world, transport, metrics
        self.rank = transport.rank
        self.spec = spec(cfg)
        self.ctx = RankContext(cfg, world, self.spec, transport, metrics, instruction_encoder(cfg.policy),
                               obs_codec(self.spec), action_codec(self.spec), cfg.runtime.expect_spin_us / 1e6,
                               task_curriculum(cfg))
        self.shards_dir = run_dir / "shards"
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.groups = [GroupLoop(self.ctx, g, self._first_seq(g)) for g in world.groups_of_sim(self.rank)]
        # Shards are written by one background thread (zarr compresses and writes without
        # holding the groups: a synchronous write blocked every group of the rank for ~90 ms
        # per segment); each is announced from this thread once it is on disk, in order.
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer")
        self.writing: deque = deque()   # (future, ShardReady)
        self.stopped = False
        self.done = False

    def _first_seq(self, g: Group) -> int:
        """Where group g continues after a restart: past every seq it ever published, and with
        runtime.keep_shards=false past the rollout steps the last checkpoint already trained
        (their shards were deleted once it was committed)."""
        seq = shards.next_seq(self.shards_dir, g.gid)
        ckpts = checkpoints.all_ckpts(self.shards_dir.parent / "ckpt")
        if ckpts and not self.cfg.runtime.keep_shards:
            seq = max(seq, checkpoints.ckpt_order(ckpts[-1])[0] * self.world.segments_per_step)
        return seq

    def step(self) -> bool:
        """One pass over the groups; returns True if anything progressed."""
        if self.stopped:
            return False
        work = self._announce_written()
        for g in self.groups:
            did, finished = g.advance(g.state == SEND and self._may_send(g))
            work |= did
            if finished is not None:
                self.publish(g.g, finished)
        got = self.transport.poll(Tag.STOP)
        if got is not None:
            self.shutdown(got[1])
        return work

    def _may_send(self, g: GroupLoop) -> bool:
        """Lockstep (sync): a group sends only when every group of the rank has its next obs ready,
        or has already asked for the same or a later position. The second case is a resume that
        left groups a segment apart: the one ahead waits (held) for credits that only the
        one behind can earn, so the one behind must not wait for it."""
        if not self.world.lockstep:
            return True
        return all(h.state == SEND or (h.state in (WAIT_ACTION, WAIT_BOOTSTRAP) and h.position >= g.position)
                   for h in self.groups)

    def deadline(self) -> float | None:
        """The earliest emulated env result due (monotonic), if any."""
        return min((t for t in (g.deadline() for g in self.groups) if t is not None), default=None)

    def wake_fds(self) -> tuple:
        """Files whose data is this rank's next work (env children's pipes): idle waits end on them."""
        return tuple(fd for g in self.groups for fd in g.wake_fds())

    def expecting(self) -> tuple[float, float] | None:
        """The first window in which a reply is due (doorbell.Cadence)."""
        return earliest((g.expecting() for g in self.groups), time.monotonic())

    def describe(self) -> str:
        return ("simulator groups: " + ", ".join(f"g{g.g.gid}:{g.state.name}@seq{g.seq}t{g.t}" for g in self.groups)
                + f"; {len(self.writing)} shard(s) being written")

    def publish(self, g: Group, seg: FinishedSegment) -> None:
        """Hand group g's finished segment to the writer; it is announced once on disk."""
        name, attrs = segment_meta(self.cfg, self.world, g, seg.seq, self.rank)
        arrays = seg.buffer.arrays
        attrs["instructions"] = seg.buffer.texts
        if seg.reset_digests is not None:
            attrs["reset_digests"], attrs["reset_seeds"] = seg.reset_digests, seg.reset_seeds
        v = arrays["versions"]
        msg = ShardReady(name, g.gid, seg.seq, seg.step_index, int(v.size), int(v.min()), int(v.max()),
                         env_steps=int(arrays["env_steps"].sum()), sim_rank=self.rank, **seg.stats)
        fut = self.writer.submit(self._write, name, arrays, seg.bootstrap, attrs)
        fut.add_done_callback(lambda _: self.transport.ring(self.rank))   # an idle rank announces it at once
        self.writing.append((fut, msg))

    def _write(self, name, arrays, bootstrap, attrs) -> tuple[float, float]:
        """(writer thread) -> (start, seconds) of the write, for the main thread's metrics."""
        t0, p0 = time.time(), time.perf_counter()
        try:
            shards.write_shard(self.shards_dir, name, arrays, bootstrap, attrs, self.cfg.runtime.shard_codec)
        except OSError as e:
            raise OSError(e.errno, f"simulator rank {self.rank}: writing shard {name} failed: "
                                   f"{checkpoints.why_write_failed(e, self.shards_dir)}") from e
        return t0, time.perf_counter() - p0

    def _announce_written(self) -> bool:
        """Announce, in order, the shards now on disk (a failed write raises here: the rank
        fails loudly and the job with it, as a synchronous write would)."""
        work = False
        while self.writing and self.writing[0][0].done():
            fut, msg = self.writing.popleft()
            t0, seconds = fut.result()
            self.metrics.span("shard_write", t0, seconds, gid=msg.gid)
            for rank in self.world.train_ranks:
                self.transport.send(rank, Tag.SHARD_READY, msg)
            work = True
        return work

    def finish_writes(self) -> None:
        deadline = time.monotonic() + self.cfg.runtime.shutdown_timeout
        while self.writing:
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulator rank {self.rank}: {len(self.writing)} shard write(s) still running "
                                   f"after runtime.shutdown_timeout={self.cfg.runtime.shutdown_timeout}s "
                                   f"(first: {self.writing[0][1].name}); is {self.shards_dir} reachable?")
            self._announce_written()
            time.sleep(0.01)
        self.writer.shutdown()

    def shutdown(self, stop: Stop) -> None:
        """Stop on the Trainer's word: drop pending replies, let in-flight requests land (the
        Generators drain until every Simulator said Done), then say Done and close the envs."""
        self.stopped = True
        self.finish_writes()   # no temporary shard left behind
        for g in self.groups:
            g.cancel()
            if g.send_req is not None:
                self.transport.wait(g.send_req, self.cfg.runtime.shutdown_timeout, g.gen_rank, "final obs send")
        done = Done(self.rank, "simulator")
        peers = {g.gen_rank for g in self.groups} | set(self.world.train_ranks)
        for r in sorted(peers):
            self.transport.send(r, Tag.DONE, done)
        for g in self.groups:
            g.env.close()
        self.done = True
