"""Rank -> role, and the per-rank main loop.

Started by a launcher on every rank as `python -m mpi4py -m rlvla3.engine.run <run_dir>` (so an
uncaught exception on any rank aborts the whole MPI job). The run folder holds the resolved
config.yaml written by the launcher. The edges between the roles are in wiring.py; the same
roles run in one process over in-process links in inprocess.py.

This module's top level imports nothing heavy: env child processes are spawned from it and
re-import it, and they must not import mpi4py or torch.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .doorbell import earliest

if TYPE_CHECKING:
    from .roles import Role


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

    def step(self, transport) -> None:
        """Rank 0, each loop: requeue once the Trainer acknowledged its checkpoint (or timed out)."""
        if not self.requested or self.requeue is None:
            return
        from .protocol import Tag

        got = transport.poll(Tag.CKPT_ACK)
        late = time.monotonic() - self.since > self.timeout
        if got is None and not late:
            return
        what = f"Trainer checkpoint {got[1].name}" if got else f"no Trainer checkpoint acknowledgement within {self.timeout:.0f}s"
        print(f"[rank 0] preempted: {what}; requeueing", file=sys.stderr, flush=True)
        requeue, self.requeue = self.requeue, None
        requeue()


def main(run_dir: str, resume: bool = False, preemption: Preemption | None = None) -> int:
    import faulthandler
    import signal

    from mpi4py import MPI

    from .. import config, notices
    from .. import world as world_mod

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    run = Path(run_dir)
    cfg = config.load(run)
    if resume:
        cfg = config.replace(cfg, resume=True)
    world = world_mod.derive(cfg)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    notices.keep_out_of_console(run, f"rank{rank:04d}", cfg.runtime.verbose)   # before torch, the simulators
    held = None
    if rank == 0:
        from . import shards
        from .lock import RunLock

        held = RunLock(run).acquire()   # before anything is written: one job per run folder
        if resume:
            shards.clean_partial(run / "shards")  # temporaries of writers that died (before any rank writes)
    preemption = preemption or Preemption()
    preemption.timeout = cfg.runtime.shutdown_timeout
    if comm.Get_size() != world.size:
        raise config.ConfigError(
            f"MPI world has {comm.Get_size()} ranks but the config needs {world.size} "
            f"(cluster.sim_ranks + gen_ranks + train_ranks, placement={cfg.mode.placement})")
    try:
        return run_roles(cfg, world, comm, run, preemption, held)
    except BaseException as e:
        if not isinstance(e, (SystemExit, KeyboardInterrupt)):
            notices.record_failure(run, rank, world.role_name(rank), e)   # the launcher's last line
        raise


def run_roles(cfg, world, comm, run: Path, preemption: Preemption, held) -> int:
    """This rank's roles from start-up to the end of the run."""
    from mpi4py import MPI

    from .. import world as world_mod
    from .metrics import Metrics
    from .transport import MpiLink, Transport
    from .wiring import Wiring

    rank = comm.Get_rank()
    rt = cfg.runtime
    bell = doorbell_of(comm, rt.wake)
    longest = rt.max_idle_wait if bell is not None and bell.reachable else rt.max_idle_sleep
    transport = Transport(MpiLink(comm), Wiring.of(world, rank), rt.startup_timeout, rt.heartbeat_interval,
                          rt.idle_sleep, longest, bell=bell, spin=rt.spin_us / 1e6)
    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
        transport.beat_in_background()   # alive while the main loop is busy (model load, checkpoint)
    elif rank == 0:
        print("note: MPI without MPI_THREAD_MULTIPLE: heartbeats come from the main loop only, so a step "
              "longer than runtime.liveness_timeout (a large checkpoint) aborts the job", file=sys.stderr)
    metrics = Metrics(run, rank, world.role_name(rank), transport.clock_offset(rt.startup_timeout))
    if rank == 0:
        print(world_mod.plan_table(world), flush=True)
    roles = build_roles(cfg, world, transport, metrics, run, rank, preemption)
    # Start-up (env processes, model init) may be slow; from here on peers must stay live.
    transport.watch_from_now(rt.liveness_timeout)
    metrics.started()
    drive(roles, transport, preemption if rank == 0 else None)
    transport.flush(rt.shutdown_timeout)
    metrics.close()
    if held is not None:
        held.release()
    return 0


def doorbell_of(comm, wake: str):
    """This rank's doorbell, connected to every other rank's (a collective: every rank calls it),
    or None with runtime.wake=sleep."""
    if wake != "doorbell":
        return None
    from .doorbell import Doorbell

    bell = Doorbell()
    bell.connect(comm.allgather(bell.address()), comm.Get_rank())
    return bell


def build_roles(cfg, world, transport, metrics, run: Path, rank: int, preemption=None) -> list:
    """The role objects `rank` hosts: a Simulator, or a Generator and/or a Trainer."""
    names = world.roles_of(rank)
    if "simulator" in names:
        from .simulator import Simulator
        return [Simulator(cfg, world, transport, metrics, run)]
    if cfg.policy.name != "emulated":  # emulated ranks never import torch
        import torch

        torch.set_num_threads(cfg.policy.torch_threads)
    roles = []
    if "generator" in names:
        from .generator import Generator
        roles.append(Generator(cfg, world, transport, metrics, world.gen_ranks.index(rank)))
    if "trainer" in names:
        from .trainer import Trainer
        roles.append(Trainer(cfg, world, transport, metrics, run, world.train_ranks.index(rank), preemption=preemption))
    return roles


def drive(roles: list[Role], transport, preemption: Preemption | None = None, stall_report: float = 10.0) -> None:
    """Step every role hosted by this rank until all are done; back off when idle (never past a
    role's `deadline()`). A rank that has made no progress for `stall_report` seconds prints what
    it is waiting for (once)."""
    last_work, reported = time.monotonic(), True  # silent until the first progress (env start-up is slow)
    while not all(r.done for r in roles):
        work = step_roles(roles, transport, preemption)
        if work:
            transport.backoff.busy()
            last_work, reported = time.monotonic(), False  # armed: report the next long stall
        else:
            due = [t for t in (r.deadline() for r in roles) if t is not None]
            expect = earliest((r.expecting() for r in roles), time.monotonic())
            transport.backoff.idle(min(due, default=None), tuple(fd for r in roles for fd in r.wake_fds()), expect)
            if not reported and time.monotonic() - last_work > stall_report:
                print(f"[rank {transport.rank}] no progress for {stall_report:.0f}s: " +
                      "; ".join(r.describe() for r in roles), file=sys.stderr, flush=True)
                reported = True


def step_roles(roles: list[Role], transport, preemption: Preemption | None = None) -> bool:
    """One pass: every role does what it can without blocking; True if any did work."""
    work = False
    for r in roles:
        work |= r.step()
    transport.tick()
    if preemption is not None:
        preemption.step(transport)
    return work


if __name__ == "__main__":
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    sys.exit(main(sys.argv[1]))
