"""Typed point-to-point messaging over mpi4py with timeouts, heartbeats and polite waiting.

Nothing here blocks without a timeout: a wait that runs out raises `PeerSilent` naming the
rank and its role. Ranks run under `python -m mpi4py`, so that uncaught exception aborts the
whole MPI job instead of leaving it hanging.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mpi4py import MPI

from .protocol import Heartbeat, Tag


class PeerSilent(RuntimeError):
    """A peer sent nothing for longer than the liveness timeout (or a wait timed out)."""


@dataclass
class Backoff:
    """Sleep that grows while a loop finds nothing to do, so idle ranks do not spin a core."""

    lo: float
    hi: float
    cur: float = 0.0

    def idle(self, until: float | None = None) -> None:
        """Sleep the next backoff step, but not past `until` (time.monotonic()): a rank that
        knows when its next piece of work is due (a batch deadline, an emulated step) wakes then."""
        self.cur = min(self.hi, max(self.lo, self.cur * 2))
        dt = self.cur if until is None else min(self.cur, until - time.monotonic())
        if dt > 0:
            time.sleep(dt)

    def busy(self) -> None:
        self.cur = 0.0


@dataclass
class Transport:
    comm: MPI.Comm
    names: dict[int, str]                 # rank -> role name, for error messages
    peers: tuple[int, ...]                # ranks this rank exchanges heartbeats with
    liveness_timeout: float
    heartbeat_interval: float
    idle_lo: float = 0.0005
    idle_hi: float = 0.005
    last_seen: dict[int, float] = field(default_factory=dict)
    _pending: list = field(default_factory=list)
    _next_beat: float = 0.0
    _closed: set = field(default_factory=set)
    done_ranks: set = field(default_factory=set)   # peers that said Done (shared by co-located roles)

    def __post_init__(self) -> None:
        self.rank = self.comm.Get_rank()
        now = time.monotonic()
        self.last_seen = {p: now for p in self.peers}
        self.backoff = Backoff(self.idle_lo, self.idle_hi)

    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.names.get(rank, '?')})"

    # ------------------------------------------------------------ control messages
    def send(self, dest: int, tag: Tag, msg) -> None:
        """Non-blocking pickled send; the request is completed in the background of poll()."""
        self._pending.append(self.comm.isend(msg, dest=dest, tag=int(tag)))
        self._reap()

    def poll(self, tag: Tag, source: int = MPI.ANY_SOURCE):
        """One waiting message with this tag as (source, msg), or None."""
        st = MPI.Status()
        if not self.comm.Iprobe(source=source, tag=int(tag), status=st):
            return None
        src = st.Get_source()
        msg = self.comm.recv(source=src, tag=int(tag))
        self.seen(src)
        return src, msg

    def recv(self, source: int, tag: Tag, timeout: float, what: str):
        """Wait (politely, at most `timeout` s) for one message; PeerSilent names the peer."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.poll(tag, source)
            if got is not None:
                self.backoff.busy()
                return got[1]
            if time.monotonic() > deadline:
                raise PeerSilent(f"rank {self.rank}: no {what} from {self.who(source)} within {timeout:.0f}s")
            self.tick()
            self.backoff.idle()

    # ------------------------------------------------------------ bulk buffers
    def isend_buf(self, dest: int, tag: int, buf):
        return self.comm.Isend(buf, dest=dest, tag=int(tag))

    def irecv_buf(self, source: int, tag: int, buf):
        return self.comm.Irecv(buf, source=source, tag=int(tag))

    def wait(self, req: MPI.Request, timeout: float, peer: int, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not req.Test():
            if time.monotonic() > deadline:
                raise PeerSilent(f"rank {self.rank}: {what} with {self.who(peer)} did not complete within {timeout:.0f}s")
            self.tick()
            self.backoff.idle()
        self.backoff.busy()
        self.seen(peer)

    # ------------------------------------------------------------ liveness
    def seen(self, rank: int) -> None:
        if rank in self.last_seen:
            self.last_seen[rank] = time.monotonic()

    def close_peer(self, rank: int) -> None:
        """A peer said it is done: stop expecting heartbeats from it."""
        self._closed.add(rank)
        self.last_seen.pop(rank, None)

    def poll_done(self) -> None:
        """Drain Done messages into `done_ranks` (one place, so co-located roles share it)."""
        while (got := self.poll(Tag.DONE)) is not None:
            self.done_ranks.add(got[0])
            self.close_peer(got[0])

    def tick(self) -> None:
        """Send due heartbeats, drain received ones, and fail on a peer silent too long."""
        now = time.monotonic()
        if now >= self._next_beat:
            beat = Heartbeat(time.time())
            for p in self.peers:
                if p not in self._closed:
                    self.send(p, Tag.HEARTBEAT, beat)
            self._next_beat = now + self.heartbeat_interval
        while self.poll(Tag.HEARTBEAT) is not None:
            pass
        for p, t in self.last_seen.items():
            if now - t > self.liveness_timeout:
                raise PeerSilent(
                    f"rank {self.rank} ({self.names.get(self.rank, '?')}): peer {self.who(p)} silent for "
                    f"{now - t:.1f}s (> runtime.liveness_timeout={self.liveness_timeout}); aborting the job")

    def _reap(self) -> None:
        if len(self._pending) > 64:
            self._pending = [r for r in self._pending if not r.Test()]

    def flush(self, timeout: float) -> None:
        """Complete every pending control send (before exit), at most `timeout` s."""
        deadline = time.monotonic() + timeout
        while self._pending:
            self._pending = [r for r in self._pending if not r.Test()]
            if self._pending and time.monotonic() > deadline:
                # Sends to peers that already exited (heartbeats) can never complete: cancel them.
                for r in self._pending:
                    r.Cancel()
                self._pending = []
            elif self._pending:
                self.backoff.idle()


def clock_offsets(comm: MPI.Comm, timeout: float, rounds: int = 5) -> float:
    """This rank's wall-clock offset to rank 0 (seconds, add it to local time), by ping-pong.

    Rank 0 answers each other rank in turn; the round trip with the smallest delay wins.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        for r in range(1, size):
            for _ in range(rounds):
                _wait_recv(comm, r, timeout)
                comm.send(time.time(), dest=r, tag=int(Tag.CLOCK))
        return 0.0
    best = None
    for _ in range(rounds):
        t0 = time.time()
        comm.send(t0, dest=0, tag=int(Tag.CLOCK))
        t_ref = _wait_recv(comm, 0, timeout)
        t1 = time.time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, t_ref - (t0 + t1) / 2)
    return best[1]


def _wait_recv(comm: MPI.Comm, source: int, timeout: float):
    deadline = time.monotonic() + timeout
    while not comm.Iprobe(source=source, tag=int(Tag.CLOCK)):
        if time.monotonic() > deadline:
            raise PeerSilent(f"rank {comm.Get_rank()}: rank {source} did not answer the clock sync within {timeout:.0f}s")
        time.sleep(0.0005)
    return comm.recv(source=source, tag=int(Tag.CLOCK))
