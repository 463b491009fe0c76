"""Trainer role: consumes shards as they are announced and trains the policy with PPO.

Trainers are data-parallel over their own process group (gloo on CPU, NCCL on GPU). Trainer 0
is the leader: it decides what each optimizer step trains (a `TrainOrder` of shard row slices,
planned by `row_plan.RowPlan`) and sends it to the others. Each optimizer step's global batch is
cut into equal contiguous row ranges, one per Trainer: a data-parallel step lasts as long as its
largest share, so shares are balanced to the row (owning whole shards, by a hash of the name,
left some Trainers with 2-3x the mean). A Trainer reads the shards its ranges touch; with
`mode.overlap` it pre-reads, as they are announced, the shards it will most likely train
(crc32(name) % n_trainers). Gradients (and the row count) are all-reduced, so every optimizer
step sees exactly `global_batch` samples however the rows are spread.

Per version k (= rollout step k):
  - the row plan decides the order of the step's rows, epoch by epoch (`row_plan`);
  - π_prox is a frozen copy of the weights at the start of the step; stale rows (behaviour
    version < k) get their proximal log-prob from it (decoupled PPO);
  - after `update_epochs * rollout_batch / global_batch` optimizer steps: publish version k+1
    with credits up to step k+1+eta, checkpoint (model, optimizer, counters, ledger), and Trainer 0
    closes the version's record (`history.History`).

Checkpoints are written at version ends (`v000012.pt`: 12 versions trained) and, on a
preemption signal, after the current optimizer step (`v000012-s0005.pt`: 5 optimizer steps of
version 12 done). A mid-version checkpoint also holds the plan's row order, cursor and π_prox,
so a resumed Trainer continues with exactly the rows that follow; a partial accumulation is
never saved, its rows are simply planned again.
"""
from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import numpy as np

from .. import notices
from ..config import RunConfig
from ..world import World, spec
from . import checkpoints, evaluator, shards, weights
from .history import History
from .learners import EmulatedLearner
from .progress import Progress
from .protocol import CheckpointAck, ShardReady, Stop, Tag, TrainOrder, WeightsHeader
from .row_plan import RowPlan
from .scalars import ScalarSinks
from .transport import PeerSilent


def make_learner(cfg, world, spec, metrics, index: int, shards_dir):
    """What Trainer `index` runs: loss, backward and optimizer, or their emulated cost."""
    n = len(world.train_ranks)
    if cfg.policy.name == "emulated":
        return EmulatedLearner(cfg, spec, metrics, n, index)
    from .torch_learner import TorchLearner  # torch: never on emulated ranks
    return TorchLearner(cfg, world, spec, metrics, n, index, shards_dir)


def likely_owner(name: str, n_trainers: int) -> int:
    """The Trainer that pre-reads a shard when it is announced (a hint: ranges decide)."""
    return zlib.crc32(name.encode()) % n_trainers


class Trainer:
    def __init__(self, cfg: RunConfig, world: World, transport, metrics, run_dir: Path, index: int, preemption=None):
        self.cfg, self.world, self.transport, self.metrics = cfg, world, transport, metrics
        self.preemption, self.preempted = preemption, False
        self.run_dir, self.index = run_dir, index
        self.leader = index == 0
        self.shards_dir = run_dir / "shards"
        self.ckpt_dir = run_dir / "ckpt"
        self.learner = make_learner(cfg, world, spec(cfg), metrics, index, self.shards_dir)
        self.version = self.opt_step = self.rows_trained = 0
        self.ledger = shards.Ledger.empty()
        # Every Trainer keeps the announcements (to pre-read and forget shards); Trainer 0 plans with them.
        self.plan = RowPlan(cfg, world.opt_steps_per_epoch, world.opt_steps_per_version, self.learner.dp_size)
        self.history = History()
        self.trained_uncommitted: list[str] = []   # keep_shards=false: deleted at the next checkpoint
        self.stopping = False
        self.done = False
        self.sending: list = []          # (Generator, request) of the last publish still in flight
        self.sending_wire = None
        self.sending_deadline = 0.0
        self.sinks = None
        self.evaluator: evaluator.Evaluator | None = None   # Trainer 0 with runtime.eval_every
        self.evaluations: list[dict] = []   # their results, this job's
        self.learner.connect(transport, world.train_ranks)
        rt = cfg.runtime
        self.saver = checkpoints.Saver(self.learner.save, self.ckpt_dir, rt.keep_ckpts, rt.ckpt_write_timeout,
                                       self._ckpts_in_use, publishes=self.leader)
        if cfg.resume:
            self._resume()
        if self.leader:
            self.ckpt_dir.mkdir(exist_ok=True)
            self.sinks = ScalarSinks(cfg, run_dir, self.history.records)
            if cfg.runtime.eval_every:
                self.evaluator = evaluator.Evaluator(cfg, run_dir, self._note)
        self.history.start_clock()
        self.progress = Progress(cfg.algo.max_versions, self.version, notices.console_is_tty(),
                                 "eval" if cfg.runtime.evaluate else "train")
        self._publish(cfg.runtime.startup_timeout)   # the Generators may still be building their models

    # ------------------------------------------------------------ setup
    def _resume(self) -> None:
        say = (lambda m: print(f"[trainer {self.index}] {m}", flush=True)) if self.leader else (lambda m: None)
        found = checkpoints.load_newest(self.learner.load, self.ckpt_dir, say)
        if found is None:
            if checkpoints.all_ckpts(self.ckpt_dir):
                raise checkpoints.CheckpointError(f"resume: no checkpoint in {self.ckpt_dir} loads (see above)")
            # Killed before its first checkpoint: train from the start, on the shards it left
            # (the Simulators continue past them, so nobody else would produce step 0).
            lost = self._reannounce()
            say(f"resume: no checkpoint yet in {self.ckpt_dir}; version 0 from the start, "
                f"{sum(map(len, self.plan.announced.values()))} shard(s) on disk announced, {lost} shard(s) of lost weights "
                f"(versions > 0) relabelled stale")
            return
        path, state = found
        self.learner.load_state(state)
        self.version, self.opt_step, self.rows_trained = (int(state[k]) for k in ("version", "opt_step", "rows_trained"))
        self.ledger = shards.Ledger.from_state(state["ledger"])
        self.history = History(json.loads(state["history"]))
        self.plan.restore(state)
        lost = self._reannounce()
        print(f"[trainer {self.index}] resumed from {path.name}: version {self.version}, step "
              f"{self.plan.step_in_version}, {self.rows_trained} rows trained, {lost} shard(s) of lost weights "
              f"(versions > {self.version}) relabelled stale", flush=True)

    def _reannounce(self) -> int:
        """After a resume: announce again the published shards of untrained steps, the current
        step's in its saved row order (the cursor points into it), then the rest in name order.
        A shard of the saved order that is gone (quarantined since) keeps its place with its
        rows, trained as absent, so the cursor still points where it pointed. Returns how many
        hold rows of versions the rollback lost."""
        saved = dict(self.plan.order)
        first = {n: i for i, (n, _) in enumerate(self.plan.order)}
        on_disk = {n for n in shards.scan(self.shards_dir) if shards.parse_name(n)[0] >= self.version}
        lost = 0
        for name in sorted(on_disk | set(saved), key=lambda n: (first.get(n, len(first)), n)):
            step, gid, seq = shards.parse_name(name)
            if name not in on_disk:
                attrs = self._absent(step, saved[name])
            else:
                try:
                    attrs = shards.read_attrs(self.shards_dir / name)
                except shards.ShardError as e:   # torn or foreign: set aside, trained as absent
                    shards.quarantine(self.shards_dir / name, str(e))
                    attrs = self._absent(step, self.world.groups[gid].size * self.cfg.algo.segment_steps)
            if attrs["max_version"] > self.version:   # produced by weights this rollback lost
                self.learner.mark_lost(name, self.version)
                lost += 1
            self._announce(ShardReady(name, gid, seq, step, attrs["rows"], attrs["min_version"], attrs["max_version"],
                                      attrs["env_steps"]))
        return lost

    @staticmethod
    def _absent(step: int, rows: int) -> dict:
        """The attributes a shard that cannot be read is announced with: its rows count toward its
        rollout step (the learner trains them as absent, as it does a shard it cannot decode)."""
        return {"rows": rows, "min_version": step, "max_version": step, "env_steps": 0}

    # ------------------------------------------------------------ intake
    def _announce(self, msg: ShardReady) -> None:
        if not self.plan.announce(msg, self.version):
            return
        if self.cfg.mode.overlap and likely_owner(msg.name, self.learner.dp_size) == self.learner.dp_index:
            self.learner.preload(msg.name)

    def _intake(self) -> bool:
        work = False
        while (got := self.transport.poll(Tag.SHARD_READY)) is not None:
            work = True
            if not self.stopping:
                self._announce(got[1])
        return work

    # ------------------------------------------------------------ training
    def _execute(self, order: TrainOrder) -> None:
        t0 = time.time()
        total = self.learner.train(order.slices, self.version, order.opt_step)
        self.opt_step = order.opt_step
        self._account(order, total)
        mine = sum(s.stop - s.start for s in order.slices if s.owner == self.learner.dp_index)
        self.metrics.span("train", t0, time.time() - t0, rows=mine, opt_step=self.opt_step, version=self.version)
        if order.end_of_version:
            self._finish_version()

    def _account(self, order: TrainOrder, total: np.ndarray) -> None:
        # Rows count as consumed in the epoch that first trains them (later epochs revisit them).
        if order.first_epoch:
            for s in order.slices:
                self.ledger.advance(s.name, s.stop)
            self.rows_trained += sum(s.stop - s.start for s in order.slices)
        self.history.add(total)

    def _finish_version(self) -> None:
        k = self.version
        self.version += 1
        arrived = self.plan.finish_version(k)
        self.learner.forget(m.name for m in arrived)
        self.learner.new_version()
        self._publish()
        rt = self.cfg.runtime
        evaluate = evaluator.due(self.cfg, self.version)
        # An evaluation run's weights never change: nothing to checkpoint.
        due = not rt.evaluate and (self.version % rt.ckpt_every == 0 or self.version >= self.cfg.algo.max_versions or evaluate)
        if due and not self.leader and self.learner.sharded_ckpts:
            self.saver.submit(self.learner.state(mid_version=False), self._ckpt_path())   # its shards of the leader's
        elif due and not self.leader and self.learner.collective:
            self.learner.state(mid_version=False)   # Megatron: this rank's part of the leader's gather
        if self.leader:
            self._log_version(k, arrived)
            if not rt.keep_shards:
                self.trained_uncommitted += [m.name for m in arrived]
            if due:
                self._checkpoint_version(evaluate)
            if self.version >= self.cfg.algo.max_versions:
                self._begin_stop("max_versions reached")

    def _checkpoint_version(self, evaluate: bool) -> None:
        """The version's checkpoint, written off the loop. Once it is on disk, the shards whose
        training it holds are deleted (runtime.keep_shards=false: a crash before then re-trains
        them from disk) and, when due, its evaluation starts."""
        committed, self.trained_uncommitted = self.trained_uncommitted, []
        version = self.version

        def then(path: Path) -> None:
            for name in committed:
                shards.remove(self.shards_dir / name)
            if evaluate:
                self.evaluator.submit(version, path)

        self.saver.submit(self._ckpt_state(), self._ckpt_path(), then)

    def _ckpts_in_use(self) -> set[str]:
        """Checkpoints an evaluation still has to read: runtime.keep_ckpts keeps them."""
        return set() if self.evaluator is None else self.evaluator.in_use()

    # ------------------------------------------------------------ weights, checkpoints, logs
    def _publish(self, timeout: float | None = None) -> None:
        """Weights of the current version + credits up to step version + eta, from Trainer 0 to every
        Generator (a colocated one on this rank too: the same edge, delivered in-process)."""
        granted = self.version + self.cfg.mode.eta
        t0 = time.time()
        # A collective learner (Megatron) gathers the LM's shards on every Trainer rank.
        flat = self.learner.weights() if self.leader or self.learner.collective else None
        leader_only = {}
        if self.leader:
            gc = self.cfg.generator
            wire = weights.to_wire(flat, gc.weights_dtype)
            leader_only = {"fingerprint": weights.fingerprint(wire)}
            hdr = WeightsHeader(self.version, granted, wire.size, gc.weights_dtype, gc.weights_bucket_mb)
            first = self.world.publish_children()   # the relay tree's first level: they forward it on
            for g in first:
                self.transport.send(g, Tag.WEIGHTS, hdr)
            self._finish_sends()   # the previous version's (long done but for a Generator that is gone)
            # Posted, not waited for: the Generators take the buckets while this rank trains on.
            self.sending = weights.send(self.transport, first, wire, gc.weights_bucket_mb)
            self.sending_wire = wire   # the buffer the sends read from stays alive until they complete
            self.sending_deadline = time.monotonic() + (timeout or self.cfg.runtime.liveness_timeout)
        self.metrics.span("weight_sync", t0, time.time() - t0, version=self.version, **leader_only)
        self.metrics.flush()   # once a version: which weights a version number named outlives a kill

    def _progress_sends(self) -> bool:
        """Complete what the Generators have taken of the last publish; a Generator that takes
        nothing until the publish's deadline is named."""
        if not self.sending:
            return False
        n = len(self.sending)
        self.sending = [(g, req) for g, req in self.sending if not req.Test()]
        if self.sending and time.monotonic() > self.sending_deadline:
            g = self.sending[0][0]
            raise PeerSilent(f"rank {self.transport.rank}: weights send to {self.transport.who(g)} did not complete "
                             f"by the publish's deadline")
        if not self.sending:
            self.sending_wire = None
        return len(self.sending) < n

    def _finish_sends(self) -> None:
        for g, req in self.sending:
            self.transport.wait(req, max(0.0, self.sending_deadline - time.monotonic()), g, "weights send")
        self.sending, self.sending_wire = [], None

    def _ckpt_state(self) -> dict:
        """model + optimizer + counters + ledger, for one file. Between optimizer steps of a version
        it also holds the step's plan state and π_prox."""
        return {**self.learner.state(mid_version=self.plan.step_in_version > 0),
                "version": self.version, "opt_step": self.opt_step, "rows_trained": self.rows_trained,
                "ledger": self.ledger.to_state(), "history": json.dumps(self.history.records), **self.plan.state()}

    def _ckpt_path(self) -> Path:
        return self.ckpt_dir / checkpoints.ckpt_name(self.version, self.plan.step_in_version, self.learner.sharded_ckpts)

    def _log_version(self, k: int, arrived: list[ShardReady]) -> None:
        rec = self.history.close(k, arrived, self.rows_trained)
        eps = rec["episodes"]
        for key, v in rec.items():
            self.metrics.scalar(key, v, version=k + 1)
        self.metrics.flush()   # a run stopped right after this version still has its record (read_history)
        if self.sinks is not None:
            self.sinks.log(rec, k + 1)
        if self.cfg.runtime.progress:
            self.progress.show(k + 1, f"rows {self.rows_trained:7d} | {rec['steps_per_s']:7.1f} steps/s | success "
                               f"{success_text(rec['success'], eps)} ({eps} eps) | pi {rec['loss_policy']:+.4f} v {rec['loss_value']:.4f}"
                               f" | staleness<= {rec['staleness_max']} | {rec['t']:.1f}s")

    def _note(self, line: str) -> None:
        self.progress.note(line)

    def _log_evaluations(self, results: list[dict]) -> None:
        """Held-out success of evaluated versions, against their version (they end while later
        versions train)."""
        for res in results:
            v = res["version"]
            self.evaluations.append({**res, "videos": [p.name for p in res["videos"]], "best": "best" in res})
            for key in ("success", "success_lo", "success_hi", "episodes"):
                self.metrics.scalar(f"eval_{key}", res[key], version=v)
            if self.sinks is not None:
                env_steps = self.history.env_steps_until(v)
                self.sinks.log_eval(res, v, env_steps)
            best = f"; the best so far -> {res['best']}" if "best" in res else ""
            self._note(f"[eval] version {v}: held-out success {res['success']:.2f} over {res['episodes']} episodes "
                       f"(95% Wilson {res['success_lo']:.2f}-{res['success_hi']:.2f}){best}")

    def wake_fds(self) -> tuple:
        return ()   # everything this role waits for comes by MPI (and rings the doorbell)

    def deadline(self) -> float | None:
        """While a publish is in flight, soon (its sends complete only as this rank looks); else
        the Trainer only waits for messages."""
        return time.monotonic() + self.cfg.runtime.idle_sleep if self.sending else None

    def expecting(self) -> None:
        return None  # shards come when Simulators finish segments: no rhythm worth spinning for

    def describe(self) -> str:
        return (f"trainer {self.index} version {self.version}, opt step {self.opt_step}, rows announced per "
                f"step {self.plan.rows_announced()}, stopping={self.stopping}")

    # ------------------------------------------------------------ loop
    def step(self) -> bool:
        if self.done:
            return False
        work = self._intake() | self.saver.poll() | self._progress_sends()
        if self.stopping:
            self.transport.poll_done()
            return work | self._maybe_done()
        if self.evaluator is not None:
            self._log_evaluations(self.evaluator.poll())
        if self.leader and self.preemption is not None and self.preemption.requested:
            return work | self._preempt()
        if self.leader:
            order = self.plan.next_order(self.version, self.opt_step)
            if order is not None:
                for r in self.world.train_ranks[1:]:
                    self.transport.send(r, Tag.TRAIN_ORDER, order)
                self._execute(order)
                work = True
        else:
            got = self.transport.poll(Tag.TRAIN_ORDER, self.world.train_ranks[0])
            if got is not None:
                work = True
                if got[1].stop:
                    self.stopping = True
                    self.saver.wait()   # its part of the last checkpoint: the leader's waits for it
                    self.record_params()
                    self.done = True
                elif got[1].checkpoint:   # a preemption's: its part of the leader's
                    mid = checkpoints.ckpt_order(Path(got[1].checkpoint))[1] > 0
                    self.saver.write_now(self.learner.state(mid_version=mid), self.ckpt_dir / got[1].checkpoint)
                else:
                    self._execute(got[1])
        return work

    def _preempt(self) -> bool:
        """Slurm is about to end the job: checkpoint between optimizer steps (this is one, as
        `step` executes whole plans), tell rank 0, and plan nothing more."""
        if self.preempted:
            return False
        self.preempted = True
        if self.learner.sharded_ckpts:
            # Every Trainer rank writes its shards of this one: the leader tells them where.
            path = self._ckpt_path()
            for r in self.world.train_ranks[1:]:
                self.transport.send(r, Tag.TRAIN_ORDER, TrainOrder(self.version, self.opt_step, checkpoint=path.name))
        elif self.learner.collective:
            # Megatron's checkpoint gathers every Trainer rank's state, and the Trainer ranks
            # gather at version ends only: the job resumes from the last version checkpoint (its
            # ledger re-trains the rest).
            done = checkpoints.all_ckpts(self.ckpt_dir)
            name = done[-1].name if done else "none"
            print(f"[trainer 0] preemption signal: a model sharded over Trainer ranks saves no mid-version "
                  f"checkpoint; resume from {name}", flush=True)
            self.transport.send(0, Tag.CKPT_ACK, CheckpointAck(name))
            return True
        path = self.saver.write_now(self._ckpt_state(), self._ckpt_path())
        print(f"[trainer 0] preemption signal: checkpoint {path.name} (version {self.version}, "
              f"step {self.plan.step_in_version}, {self.rows_trained} rows trained)", flush=True)
        self.transport.send(0, Tag.CKPT_ACK, CheckpointAck(path.name))
        return True

    def _begin_stop(self, reason: str) -> None:
        self.stopping = True
        for r in self.world.train_ranks[1:]:
            self.transport.send(r, Tag.TRAIN_ORDER, TrainOrder(self.version, self.opt_step, stop=True))
        stop = Stop(reason)
        # The last publish is taken before Stop goes out: a Generator that met Stop first could
        # finish without ever reading the version's header (different tags have no order), and
        # each relays Stop only once what it relayed has been taken below it.
        self._finish_sends()
        for r in (*self.world.sim_ranks, *self.world.publish_children()):   # Generators relay it down the tree
            self.transport.send(r, Tag.STOP, stop)

    def _maybe_done(self) -> bool:
        expected = set(self.world.sim_ranks) | set(self.world.gen_ranks)
        if not expected <= self.transport.done_ranks:
            return False
        self.progress.close()
        self._finish_sends()
        self.saver.wait()   # the last version's checkpoint (and the evaluation it starts)
        if self.evaluator is not None:
            self._log_evaluations(self.evaluator.finish())
        self.record_params()
        self._write_summary()
        if self.sinks is not None:
            self.sinks.close()
        self.done = True
        return True

    def record_params(self) -> None:
        """A hash of this Trainer's parameters (data-parallel ranks must agree bit for bit)."""
        (self.run_dir / f"params-trainer{self.index}.sha256").write_text(self.learner.digest() + "\n")

    def _write_summary(self) -> None:
        summary = {"versions": self.version, "opt_steps": self.opt_step, "rows_trained": self.rows_trained,
                   "wall_s": time.time() - self.history.t0, "bad_shards": sorted(self.learner.bad), "history": self.history.records,
                   "param_digest": self.learner.digest(), "evaluations": self.evaluations,
                   "ckpt_stall_s": self.saver.stall_s,
                   "best": self.evaluator.best if self.evaluator is not None else None}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))


def success_text(success: float, episodes: int) -> str:
    """A version's success for its progress line: no finished episode has no rate (not "nan")."""
    return f"{success:.2f}" if episodes else "  - "
