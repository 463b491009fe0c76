"""Typed point-to-point messaging with timeouts, heartbeats and polite waiting, over a link.

`Transport` has the verbs every role uses (send/poll/recv for control messages, isend_buf/
irecv_buf/recv_buf_now for bulk buffers, wait for a request) and checks each message against the
edge list (wiring.py) before it leaves or after it arrives. Underneath is a link:

- `MpiLink`: mpi4py on a communicator (the real run). A message a rank sends to itself (a
  colocated Trainer's weights for its own Generator) is delivered in-process instead: a blocking
  self-send of a large buffer could never complete on one thread.
- `LocalLink`: every rank of a run in one process, one mailbox per rank (inprocess.py), so tests
  drive Simulator, Generator and Trainer in one process with the same verbs.

Nothing here blocks without a timeout: a wait that runs out raises `PeerSilent` naming the rank
and its role. Ranks run under `python -m mpi4py`, so that uncaught exception aborts the whole
MPI job instead of leaving it hanging.
"""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import doorbell
from .protocol import ClockSync, Heartbeat, Tag
from .wiring import Wiring

ANY_SOURCE = -1


class PeerSilent(RuntimeError):
    """A peer sent nothing for longer than the liveness timeout (or a wait timed out)."""


@dataclass
class Backoff:
    """A wait that grows while a loop finds nothing to do, so idle ranks do not spin a core.

    `wait(timeout, fds)` is the doorbell's (doorbell.py: it returns early when a peer rings or
    one of `fds` has data) or a plain sleep."""

    lo: float
    hi: float
    cur: float = 0.0
    wait: Callable[[float, tuple], bool] = doorbell.sleep
    spin: float = 0.0      # seconds after the last work during which idle passes only yield the core
    spins: int = 0         # passes left that look again without waiting (after an early wake)
    last_work: float = 0.0
    SPINS_AFTER_WAKE = 8   # Open MPI shows an arrived message to Iprobe after ~3 progress calls

    def idle(self, until: float | None = None, fds: tuple = (), expect: tuple[float, float] | None = None) -> None:
        """Wait the next backoff step, but not past `until` (time.monotonic()): a rank that
        knows when its next piece of work is due (a batch deadline, an emulated step) wakes then.
        Right after an early wake (a ring, data on `fds`) a few passes look again at once; for
        `spin` seconds after work every pass does, and so does every pass inside `expect` (a
        message's (from, to) window, `doorbell.Cadence`), which a wait does not sleep into."""
        if self.spins > 0:
            self.spins -= 1
            return
        if self.spin and time.perf_counter() - self.last_work < self.spin:
            os.sched_yield()
            return
        if expect is not None:
            now = time.monotonic()
            if expect[0] <= now <= expect[1]:
                os.sched_yield()
                return
            if now < expect[0]:
                until = expect[0] if until is None else min(until, expect[0])
        self.cur = min(self.hi, max(self.lo, self.cur * 2))
        dt = self.cur if until is None else min(self.cur, until - time.monotonic())
        if self.wait(dt, fds):
            self.cur, self.spins = 0.0, self.SPINS_AFTER_WAKE

    def busy(self) -> None:
        self.cur, self.spins = 0.0, 0
        if self.spin:
            self.last_work = time.perf_counter()


# ---------------------------------------------------------------- in-process delivery


class Completed:
    """A request that completed when it was made (an in-process send)."""

    def Test(self) -> bool:  # noqa: N802  (mpi4py's request interface)
        return True

    def Wait(self) -> None:  # noqa: N802
        pass

    def Cancel(self) -> None:  # noqa: N802
        pass


class Mailbox:
    """Messages delivered in-process to one rank, in order per (source, tag) as MPI keeps them."""

    def __init__(self):
        self.queues: dict[int, dict[int, deque]] = defaultdict(lambda: defaultdict(deque))   # tag -> src -> items

    def put(self, src: int, tag: int, item) -> None:
        self.queues[tag][src].append(item)

    def source(self, src: int, tag: int) -> int | None:
        """A source with a waiting message (src, or any when src is ANY_SOURCE), or None."""
        by_src = self.queues.get(tag)
        if not by_src:
            return None
        if src != ANY_SOURCE:
            return src if by_src.get(src) else None
        return next((s for s, q in by_src.items() if q), None)

    def take(self, src: int, tag: int):
        return self.queues[tag][src].popleft()

    def waiting_bytes(self, src: int, tag: int) -> int | None:
        """Bytes of the next buffer waiting from src (a buffer message's size), or None."""
        return self.queues[tag][src][0].nbytes if self.source(src, tag) is not None else None


class PendingRecv:
    """An in-process buffer receive: completes once the matching buffer is in the mailbox."""

    def __init__(self, box: Mailbox, src: int, tag: int, buf: np.ndarray):
        self.box, self.src, self.tag, self.buf = box, src, tag, buf
        self.done = self.cancelled = False

    def Test(self) -> bool:  # noqa: N802
        if not self.done and not self.cancelled and self.box.source(self.src, self.tag) is not None:
            copy_into(self.buf, self.box.take(self.src, self.tag))
            self.done = True
        return self.done or self.cancelled

    def Wait(self) -> None:  # noqa: N802
        if not self.Test():
            raise RuntimeError(f"in-process receive (tag {self.tag} from rank {self.src}) has no message to wait for")

    def Cancel(self) -> None:  # noqa: N802
        self.cancelled = True


def copy_into(buf: np.ndarray, data: np.ndarray) -> None:
    if data.nbytes != buf.nbytes:
        raise RuntimeError(f"buffer of {data.nbytes} bytes received into one of {buf.nbytes}")
    buf.view(np.uint8).reshape(-1)[:] = data.view(np.uint8).reshape(-1)


# ---------------------------------------------------------------- links


class MpiLink:
    """mpi4py on `comm`; messages to this rank itself go through an in-process mailbox."""

    def __init__(self, comm):
        from mpi4py import MPI

        self.comm, self.MPI = comm, MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.own = Mailbox()

    def isend(self, msg, dest: int, tag: int):
        if dest == self.rank:
            self.own.put(dest, tag, msg)
            return Completed()
        return self.comm.isend(msg, dest=dest, tag=tag)

    def probe(self, source: int, tag: int) -> int | None:
        if source == self.rank:
            return self.own.source(source, tag)   # self-sends never go through MPI
        src = self.own.source(source, tag) if source == ANY_SOURCE else None
        if src is not None:
            return src
        st = self.MPI.Status()
        if self.comm.Iprobe(source=self.MPI.ANY_SOURCE if source == ANY_SOURCE else source, tag=tag, status=st):
            return st.Get_source()
        return None

    def recv(self, source: int, tag: int):
        if source == self.rank:
            return self.own.take(source, tag)
        return self.comm.recv(source=source, tag=tag)

    def probe_bytes(self, source: int, tag: int) -> int | None:
        """Bytes of a buffer message waiting from `source` (not ANY_SOURCE), or None."""
        if source == self.rank:
            return self.own.waiting_bytes(source, tag)
        st = self.MPI.Status()
        if self.comm.Iprobe(source=source, tag=tag, status=st):
            return st.Get_count(self.MPI.BYTE)
        return None

    def Isend(self, buf: np.ndarray, dest: int, tag: int):  # noqa: N802
        if dest == self.rank:
            self.own.put(dest, tag, buf.copy())
            return Completed()
        return self.comm.Isend(buf, dest=dest, tag=tag)

    def Irecv(self, buf: np.ndarray, source: int, tag: int):  # noqa: N802
        if source == self.rank:
            return PendingRecv(self.own, source, tag, buf)
        return self.comm.Irecv(buf, source=source, tag=tag)

    def Recv(self, buf: np.ndarray, source: int, tag: int) -> None:  # noqa: N802
        if source == self.rank:
            copy_into(buf, self.own.take(source, tag))
        else:
            self.comm.Recv(buf, source=source, tag=tag)


class LocalLink:
    """One rank's end of an in-process world: `boxes[r]` is rank r's mailbox."""

    def __init__(self, boxes: list[Mailbox], rank: int):
        self.boxes, self.rank, self.size = boxes, rank, len(boxes)

    def isend(self, msg, dest: int, tag: int):
        self.boxes[dest].put(self.rank, tag, msg)   # frozen dataclasses: shared, never mutated
        return Completed()

    def probe(self, source: int, tag: int) -> int | None:
        return self.boxes[self.rank].source(source, tag)

    def recv(self, source: int, tag: int):
        return self.boxes[self.rank].take(source, tag)

    def probe_bytes(self, source: int, tag: int) -> int | None:
        return self.boxes[self.rank].waiting_bytes(source, tag)

    def Isend(self, buf: np.ndarray, dest: int, tag: int):  # noqa: N802
        self.boxes[dest].put(self.rank, tag, buf.copy())   # the sender reuses its buffer at once
        return Completed()

    def Irecv(self, buf: np.ndarray, source: int, tag: int):  # noqa: N802
        return PendingRecv(self.boxes[self.rank], source, tag, buf)

    def Recv(self, buf: np.ndarray, source: int, tag: int) -> None:  # noqa: N802
        copy_into(buf, self.boxes[self.rank].take(source, tag))


# ---------------------------------------------------------------- the verbs


@dataclass
class Transport:
    link: object                          # MpiLink or LocalLink
    wiring: Wiring
    startup_timeout: float                # how long a peer still starting up may be silent
    heartbeat_interval: float
    idle_lo: float = 0.0005
    idle_hi: float = 0.005
    bell: doorbell.Doorbell | None = None   # rung on every send; None: peers are found by polling alone
    spin: float = 0.0                       # runtime.spin_us, in seconds
    liveness_timeout: float | None = None  # set by `watch_from_now`, when this rank's start-up is over
    last_seen: dict[int, float] = field(default_factory=dict)
    started_peers: set = field(default_factory=set)   # peers whose heartbeats say their start-up is over
    _pending: list = field(default_factory=list)
    _next_beat: float = 0.0
    _closed: set = field(default_factory=set)
    done_ranks: set = field(default_factory=set)   # peers that said Done (shared by co-located roles)

    def __post_init__(self) -> None:
        self.rank = self.link.rank
        now = time.monotonic()
        self.peers = tuple(sorted(self.wiring.peers))
        self.last_seen = {p: now for p in self.peers}
        self.backoff = Backoff(self.idle_lo, self.idle_hi, wait=self.bell.wait if self.bell else doorbell.sleep, spin=self.spin)
        self._lock = threading.Lock()       # _pending is appended to by the heartbeat thread too
        self._beater: threading.Thread | None = None
        self._stop_beats = threading.Event()

    def beat_in_background(self) -> None:
        """Send heartbeats from a daemon thread, so a rank whose main loop is busy for long (a
        model loading at start-up, a checkpoint of a large model, a burst of shard reads) still
        tells its peers it is alive. Receiving and the liveness check stay in `tick`. Needs MPI
        with MPI_THREAD_MULTIPLE (mpi4py asks for it; Open MPI provides it)."""
        def beat():
            while not self._stop_beats.wait(self.heartbeat_interval):
                self._send_beats()
        self._beater = threading.Thread(target=beat, name="heartbeats", daemon=True)
        self._beater.start()

    def _send_beats(self) -> None:
        beat = Heartbeat(time.time(), started=self.liveness_timeout is not None)
        for p in self.peers:
            if p not in self._closed:
                self.send(p, Tag.HEARTBEAT, beat)

    def who(self, rank: int) -> str:
        return self.wiring.name(rank)

    # ------------------------------------------------------------ control messages
    def send(self, dest: int, tag: Tag, msg) -> None:
        """Non-blocking pickled send; the request is completed in the background of poll()."""
        self.wiring.check_send(dest, tag, msg)
        req = self.link.isend(msg, dest, int(tag))
        if tag != Tag.HEARTBEAT:   # a heartbeat needs no answer: let an idle peer sleep on
            self.ring(dest)
        with self._lock:
            self._pending.append(req)
            self._reap()

    def ring(self, dest: int) -> None:
        if self.bell is not None:
            self.bell.ring(dest)

    def poll(self, tag: Tag, source: int = ANY_SOURCE):
        """One waiting message with this tag as (source, msg), or None."""
        src = self.link.probe(source, int(tag))
        if src is None:
            return None
        self.wiring.check_recv(src, tag)
        msg = self.link.recv(src, int(tag))
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
    def isend_buf(self, dest: int, tag: int, buf: np.ndarray):
        self.wiring.check_send(dest, tag, buf)
        req = self.link.Isend(buf, dest, int(tag))
        self.ring(dest)
        return req

    def irecv_buf(self, source: int, tag: int, buf: np.ndarray):
        self.wiring.check_recv(source, tag)
        return self.link.Irecv(buf, source, int(tag))

    def recv_buf_now(self, source: int, tag: int, buf: np.ndarray) -> bool:
        """Receive a buffer into `buf` if one is waiting (never waits); True if it did."""
        if self.link.probe(source, int(tag)) is None:
            return False
        self.wiring.check_recv(source, tag)
        self.link.Recv(buf, source, int(tag))   # matched by the probe: no wait
        self.seen(source)
        return True

    def recv_bytes_now(self, source: int, tag: int, buf: np.ndarray) -> np.ndarray | None:
        """Receive a buffer of any size up to buf.nbytes if one is waiting (never waits): the
        view of `buf` it filled, or None."""
        n = self.link.probe_bytes(source, int(tag))
        if n is None:
            return None
        if n > buf.nbytes:
            raise RuntimeError(f"{self.who(self.rank)}: a {n}-byte message from {self.who(source)} (tag {tag}) "
                               f"does not fit the {buf.nbytes}-byte receive buffer")
        self.wiring.check_recv(source, tag)
        self.link.Recv(buf[:n], source, int(tag))
        self.seen(source)
        return buf[:n]

    def wait(self, req, timeout: float, peer: int, what: str) -> None:
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

    def watch_from_now(self, liveness_timeout: float) -> None:
        """This rank's start-up is over (envs started, model built): its heartbeats say so from
        now on, and each peer is held to `liveness_timeout` once its own heartbeats say the same.
        Until then a peer may be silent for `startup_timeout`: a start-up step that holds the GIL
        (a large extension module being loaded on a crowded node) also stops its heartbeat thread,
        and the ranks that are ready first must not blame it."""
        self.liveness_timeout = liveness_timeout
        for p in self.last_seen:
            self.seen(p)

    def silence_limit(self, peer: int) -> float:
        if self.liveness_timeout is not None and peer in self.started_peers:
            return self.liveness_timeout
        return self.startup_timeout

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
        """Send due heartbeats (unless a thread does), drain received ones, and fail on a peer
        silent too long."""
        now = time.monotonic()
        if self._beater is None and now >= self._next_beat:
            self._send_beats()
            self._next_beat = now + self.heartbeat_interval
        self._drain_beats()
        late = [p for p, t in self.last_seen.items() if now - t > self.silence_limit(p)]
        if late:
            # After this rank was busy for long, MPI's progress engine may need a few calls to
            # match what arrived meanwhile: look again before blaming a peer.
            for _ in range(5):
                time.sleep(0.001)
                self._drain_beats()
            now = time.monotonic()
            late = [p for p in late if now - self.last_seen.get(p, now) > self.silence_limit(p)]
        for p in late:
            limit = ("runtime.liveness_timeout" if p in self.started_peers else
                     "runtime.startup_timeout, still starting up")
            raise PeerSilent(
                f"{self.who(self.rank)}: peer {self.who(p)} silent for {now - self.last_seen[p]:.1f}s "
                f"(> {limit}={self.silence_limit(p)}); aborting the job")

    def _drain_beats(self) -> None:
        while (got := self.poll(Tag.HEARTBEAT)) is not None:
            if got[1].started:
                self.started_peers.add(got[0])

    def _reap(self) -> None:
        if len(self._pending) > 64:
            self._pending = [r for r in self._pending if not r.Test()]

    def flush(self, timeout: float) -> None:
        """Stop the heartbeat thread; complete every pending control send (before exit), at most
        `timeout` s."""
        if self._beater is not None:
            self._stop_beats.set()
            self._beater.join(timeout=2 * self.heartbeat_interval + 1)
            self._beater = None
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

    # ------------------------------------------------------------ clock
    def clock_offset(self, timeout: float, rounds: int = 5) -> float:
        """This rank's wall-clock offset to rank 0 (seconds, add it to local time), by ping-pong.
        Rank 0 answers each other rank in turn; the round trip with the smallest delay wins."""
        if self.rank == 0:
            for r in range(1, self.link.size):
                for _ in range(rounds):
                    self.recv(r, Tag.CLOCK, timeout, "clock sync")
                    self.send(r, Tag.CLOCK, ClockSync(time.time()))
            return 0.0
        best = None
        for _ in range(rounds):
            t0 = time.time()
            self.send(0, Tag.CLOCK, ClockSync(t0))
            t_ref = self.recv(0, Tag.CLOCK, timeout, "clock sync").t
            t1 = time.time()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, t_ref - (t0 + t1) / 2)
        return best[1]
