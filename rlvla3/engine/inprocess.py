"""Every rank of a run in one process: the roles of run.py over in-process links, for tests.

`InProcessRun(cfg, run_dir)` builds each rank's roles exactly as `run.main` does, but each rank's
`Transport` sits on a `LocalLink` (one mailbox per rank) instead of MPI, and one thread steps the
ranks in turn. The messages, their edges (checked), the batcher, credits, lockstep rounds, shards,
versions and checkpoints are the real ones, so a test can drive Simulator, Generator and Trainer
on `toy` or `emulated` in seconds and look at their state between passes (`step`, `roles`).

What it cannot host: a data-parallel torch learner (`cluster.train_ranks > 1` with a torch
policy), whose process group needs one process per Trainer. Env child processes work as usual.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import config
from ..world import derive
from .metrics import Metrics
from .run import build_roles, step_roles
from .transport import LocalLink, Mailbox, Transport
from .wiring import Wiring


class InProcessRun:
    def __init__(self, cfg: config.RunConfig, run_dir: str | Path, preemption=None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg = config.replace(cfg, run_dir=str(self.run_dir))
        self.world = derive(self.cfg)
        if len(self.world.train_ranks) > 1 and self.cfg.policy.name != "emulated":
            raise config.ConfigError(f"cluster.train_ranks={len(self.world.train_ranks)}: an in-process run hosts one "
                                     "torch Trainer (data parallelism needs a process per Trainer); use mpiexec")
        config.save(self.cfg, self.run_dir)
        rt = self.cfg.runtime
        boxes = [Mailbox() for _ in range(self.world.size)]
        self.transports = [Transport(LocalLink(boxes, r), Wiring.of(self.world, r), rt.startup_timeout,
                                     rt.heartbeat_interval, rt.idle_sleep, rt.max_idle_sleep)
                           for r in range(self.world.size)]
        self.metrics = [Metrics(self.run_dir, r, self.world.role_name(r), 0.0) for r in range(self.world.size)]
        self.preemption = preemption   # run.Preemption: rank 0 requeues, as under Slurm
        self.roles = [build_roles(self.cfg, self.world, self.transports[r], self.metrics[r], self.run_dir, r, preemption)
                      for r in range(self.world.size)]
        for t in self.transports:
            t.watch_from_now(rt.liveness_timeout)
        self.passes = 0

    @property
    def done(self) -> bool:
        return all(r.done for roles in self.roles for r in roles)

    def role(self, kind: type, index: int = 0):
        """The `index`-th role object of this class (e.g. role(Generator, 0))."""
        return [r for roles in self.roles for r in roles if isinstance(r, kind)][index]

    def step(self) -> bool:
        """One pass over every rank; True if any role did work."""
        work = False
        for rank, (roles, transport) in enumerate(zip(self.roles, self.transports)):
            if not all(r.done for r in roles):
                work |= step_roles(roles, transport, self.preemption if rank == 0 else None)
        self.passes += 1
        return work

    def run(self, timeout: float, check=None, until=None) -> None:
        """Step until every role is done, or until(self) (at most `timeout` s), calling check(self)
        after each pass."""
        deadline = time.monotonic() + timeout
        while not self.done and not (until is not None and until(self)):
            if not self.step():
                due = [t for roles in self.roles for r in roles if (t := r.deadline()) is not None]
                self.transports[0].backoff.idle(min(due, default=None))
            else:
                self.transports[0].backoff.busy()
            if check is not None:
                check(self)
            if time.monotonic() > deadline:
                states = "; ".join(r.describe() for roles in self.roles for r in roles if not r.done)
                raise TimeoutError(f"in-process run not done after {timeout:.0f}s ({self.passes} passes): {states}")
        self.close()

    def close(self) -> None:
        """What the end of a job's processes would do: shard writes finish (a run stopped by
        `until` leaves them in flight), checkpoint writes too, sends complete, metrics close, and the
        Trainer's torch process group ends (a later run in this process makes its own)."""
        from .simulator import Simulator
        from .trainer import Trainer

        for roles in self.roles:
            for r in roles:
                if isinstance(r, Simulator) and not r.done:
                    r.finish_writes()
                if isinstance(r, Trainer):
                    r.saver.wait()
        for t in self.transports:
            t.flush(self.cfg.runtime.shutdown_timeout)
        for m in self.metrics:
            m.close()
        dist = sys.modules.get("torch.distributed")   # never imported by an emulated run
        if dist is not None and dist.is_initialized():
            dist.destroy_process_group()
