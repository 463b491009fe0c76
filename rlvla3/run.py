"""Rank -> role, the one list of message edges, and the per-rank main loop.

Started by a launcher on every rank as `python -m mpi4py -m rlvla3.run <run_dir>` (so an
uncaught exception on any rank aborts the whole MPI job). The run folder holds the resolved
config.yaml written by the launcher.

This module's top level imports nothing heavy: env child processes are spawned from it and
re-import it, and they must not import mpi4py or torch.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# (from role, to role, tag): every message edge of rlvla3. "trainer0" is the leading Trainer.
# Heartbeats flow both ways along every edge; a peer silent past runtime.liveness_timeout
# aborts the job naming that rank.
EDGES = (
    ("simulator", "generator", "OBS"),          # ObsRequest buffer, per group
    ("generator", "simulator", "ACTION"),       # ActionReply buffer, per group
    ("simulator", "trainer", "SHARD_READY"),    # a shard was published
    ("simulator", "generator", "DONE"),
    ("simulator", "trainer", "DONE"),
    ("trainer0", "generator", "WEIGHTS"),       # header + flat buffer, with credits
    ("trainer0", "simulator", "STOP"),
    ("trainer0", "generator", "STOP"),
    ("trainer0", "trainer", "PLAN"),            # what each optimizer step trains
    ("generator", "trainer0", "DONE"),
    ("trainer0", "rank0", "CKPT_ACK"),          # preemption: checkpoint written, rank 0 may requeue
)


def ranks_of(d, role: str, rank: int) -> set[int]:
    """Concrete ranks playing `role` that talk with `rank` (groups pin sims to generators)."""
    if role == "trainer0":
        return {d.train_ranks[0]}
    if role == "rank0":
        return {0}
    if role == "trainer":
        return set(d.train_ranks)
    mine = set(d.role_of(rank))
    if role == "generator" and "simulator" in mine:
        return {d.gen_ranks[g.gen_index] for g in d.groups_of_sim(rank)}
    if role == "simulator" and "generator" in mine:
        return {g.sim_rank for g in d.groups_of_gen(d.gen_ranks.index(rank))}
    return set({"simulator": d.sim_ranks, "generator": d.gen_ranks}[role])


def peers(d, rank: int) -> tuple[int, ...]:
    """Ranks this rank exchanges heartbeats with: both ends of every edge it is on."""
    mine = set(d.role_of(rank))
    mine |= {name for name, r in (("trainer0", d.train_ranks[0]), ("rank0", 0)) if r == rank}
    out: set[int] = set()
    for src, dst, _ in EDGES:
        if src in mine:
            out |= ranks_of(d, dst, rank)
        if dst in mine:
            out |= ranks_of(d, src, rank)
    out.discard(rank)
    return tuple(sorted(out))


class Preemption:
    """Slurm's warning before a time limit or preemption (USR2, see slurm.py).

    The signal handler only sets `requested`; the roles act on it from their loops: the leading
    Trainer checkpoints after its current optimizer step and sends CKPT_ACK to rank 0, and rank 0
    then calls `requeue` (submitit's checkpoint-and-requeue, which exits). If the acknowledgement
    does not come within `timeout` seconds, rank 0 requeues anyway and says so: the job resumes
    from the last version checkpoint, which loses time but no committed data.
    """

    def __init__(self, requeue=None, timeout: float = 60.0):
        self.requeue, self.timeout = requeue, timeout
        self.requested = False
        self.since = 0.0

    def handler(self, signum, frame) -> None:
        if not self.requested:
            self.requested, self.since = True, time.monotonic()

    def step(self, tr) -> None:
        """Rank 0, each loop: requeue once the Trainer acknowledged its checkpoint (or timed out)."""
        if not self.requested or self.requeue is None:
            return
        from .protocol import Tag

        got = tr.poll(Tag.CKPT_ACK)
        late = time.monotonic() - self.since > self.timeout
        if got is None and not late:
            return
        what = f"Trainer checkpoint {got[1]}" if got else f"no Trainer checkpoint acknowledgement within {self.timeout:.0f}s"
        print(f"[rank 0] preempted: {what}; requeueing", file=sys.stderr, flush=True)
        requeue, self.requeue = self.requeue, None
        requeue()


def main(run_dir: str, resume: bool = False, preemption: Preemption | None = None) -> int:
    import faulthandler
    import signal

    from mpi4py import MPI

    from . import config
    from .metrics import Metrics
    from .transport import Transport, clock_offsets

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    run = Path(run_dir)
    cfg = config.load(run)
    if resume:
        cfg = config.replace(cfg, resume=True)
    d = config.derive(cfg)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if resume and rank == 0:
        from . import shards
        shards.clean_partial(run / "shards")  # temporaries of writers that died (before any rank writes)
    preemption = preemption or Preemption()
    preemption.timeout = cfg.runtime.shutdown_timeout
    if comm.Get_size() != d.world_size:
        raise config.ConfigError(
            f"MPI world has {comm.Get_size()} ranks but the config needs {d.world_size} "
            f"(cluster.sim_ranks + gen_ranks + train_ranks, placement={cfg.mode.placement})")
    roles = d.role_of(rank)
    role_name = "+".join(roles)
    names = {r: "+".join(d.role_of(r)) for r in range(d.world_size)}
    offset = clock_offsets(comm, cfg.runtime.startup_timeout)
    metrics = Metrics(run, rank, role_name, offset)
    tr = Transport(comm, names, peers(d, rank), cfg.runtime.startup_timeout, cfg.runtime.heartbeat_interval,
                   cfg.runtime.idle_sleep, cfg.runtime.max_idle_sleep)
    if rank == 0:
        print(config.plan_table(cfg, d), flush=True)
    actors = build_roles(cfg, d, tr, metrics, run, roles, rank, preemption)
    # Start-up (env processes, model init) may be slow; from here on peers must stay live.
    tr.liveness_timeout = cfg.runtime.liveness_timeout
    for p in tr.last_seen:
        tr.seen(p)
    drive(actors, tr, preemption if rank == 0 else None)
    tr.flush(cfg.runtime.shutdown_timeout)
    metrics.close()
    return 0


def build_roles(cfg, d, tr, metrics, run: Path, roles: list[str], rank: int, preemption=None) -> list:
    if "simulator" in roles:
        from .simulator import Simulator
        return [Simulator(cfg, d, tr, metrics, run)]
    if cfg.policy.name != "emulated":  # emulated ranks never import torch
        import torch

        torch.set_num_threads(cfg.policy.torch_threads)
    actors = []
    gen = None
    if "generator" in roles:
        from .generator import Generator
        gen = Generator(cfg, d, tr, metrics, d.gen_ranks.index(rank))
        actors.append(gen)
    if "trainer" in roles:
        from .trainer import Trainer
        actors.append(Trainer(cfg, d, tr, metrics, run, d.train_ranks.index(rank), local_gen=gen, preemption=preemption))
    return actors


def drive(actors: list, tr, preemption: Preemption | None = None, stall_report: float = 10.0) -> None:
    """Step every role hosted by this rank until all are done; back off when idle (never past a
    role's `deadline()`). A rank that has made no progress for `stall_report` seconds prints what
    it is waiting for (once)."""
    last_work, reported = time.monotonic(), True  # silent until the first progress (env start-up is slow)
    while not all(a.done for a in actors):
        work = False
        for a in actors:
            work |= a.step()
        tr.tick()
        if preemption is not None:
            preemption.step(tr)
        if work:
            tr.backoff.busy()
            last_work, reported = time.monotonic(), False  # armed: report the next long stall
        else:
            due = [t for t in (a.deadline() for a in actors) if t is not None]
            tr.backoff.idle(min(due, default=None))
            if not reported and time.monotonic() - last_work > stall_report:
                print(f"[rank {tr.rank}] no progress for {stall_report:.0f}s: " +
                      "; ".join(a.describe() for a in actors), file=sys.stderr, flush=True)
                reported = True


if __name__ == "__main__":
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    sys.exit(main(sys.argv[1]))
