"""Event-driven wake-up for idle ranks: a UDP doorbell per rank.

MPI (Open MPI, mpi4py) has no wait with a timeout, and its blocking calls spin a core. So an
idle rank used to sleep in growing steps (`runtime.idle_sleep` .. `max_idle_sleep`) and poll:
every hop of an action request could wait up to that ceiling (p50 3.9 ms for 1 Simulator +
1 Generator, `python -m rlvla3.bench latency`). With a doorbell, a rank that sends a message
(`Transport.send`, `isend_buf`) also sends one byte to the receiver's UDP socket, and an idle
rank waits in `select` on that socket (and on any other file it expects data from, such as its
env children's pipes) for at most the same ceiling. It wakes within tens of microseconds of the
send and burns no CPU while it waits.

The ring is only a hint, never a message: a lost ring (a firewall between nodes, a full socket
buffer) costs at most the ceiling, as before; the data itself always travels by MPI. Peers on the
same host ring over 127.0.0.1; peers elsewhere ring the address their host name resolves to,
and not at all when that is a loopback address (a node whose /etc/hosts maps its own name there):
a rank that some peer cannot ring keeps the short polling ceiling (`reachable`).
"""
from __future__ import annotations

import errno
import ipaddress
import select
import socket
import time
from dataclasses import dataclass

RING = b"!"


def host_address() -> tuple[str, str]:
    """(host name, the IPv4 address peers on other hosts should ring, or '' if there is none)."""
    name = socket.gethostname()
    try:
        ip = socket.gethostbyname(name)
    except OSError:
        return name, ""
    return name, ("" if ipaddress.ip_address(ip).is_loopback else ip)


class Doorbell:
    """This rank's wake-up socket, and where each peer's is (`connect`)."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.setblocking(False)
        self.host, self.ip = host_address()
        self.peers: dict[int, tuple[str, int]] = {}
        self.reachable = True   # every peer can ring this rank (`connect` knows)
        self.rings = 0          # received, counted for the latency benchmark

    def address(self) -> tuple[str, str, int]:
        """What the other ranks need to ring this one (gathered over MPI at start-up)."""
        return self.host, self.ip, self.sock.getsockname()[1]

    def connect(self, addresses: list[tuple[str, str, int]], rank: int) -> None:
        """addresses[r]: rank r's `address()`. A peer with no reachable address is not rung."""
        for r, (host, ip, port) in enumerate(addresses):   # this rank too: its shard writer thread rings it
            if host == self.host:
                self.peers[r] = ("127.0.0.1", port)
            elif ip:
                self.peers[r] = (ip, port)
        self.reachable = bool(self.ip) or all(host == self.host for host, _, _ in addresses)

    def ring(self, rank: int) -> None:
        """Tell `rank` a message is on its way (never blocks, never fails the sender)."""
        addr = self.peers.get(rank)
        if addr is None:
            return
        try:
            self.sock.sendto(RING, addr)
        except OSError:
            pass   # the ring is a hint: the receiver's bounded wait picks the message up anyway

    def wait(self, timeout: float, fds: tuple = ()) -> bool:
        """Sleep until a ring, data on one of `fds`, or `timeout` seconds; True if woken early
        (a ring or data: the caller should look again at once, and a few times: Open MPI makes
        a message that has arrived visible to Iprobe only after a few progress calls)."""
        ready = ()
        if timeout > 0:
            try:
                ready = select.select([self.sock, *fds], [], [], timeout)[0]
            except (OSError, ValueError):   # an fd closed under us (an env child restarted): just sleep
                time.sleep(timeout)
        return self.drain() or bool(ready)

    def drain(self) -> bool:
        """Read every pending ring; True if there was one."""
        rung = False
        while True:
            try:
                self.sock.recv(64)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                    raise
                return rung
            self.rings += 1
            rung = True

    def close(self) -> None:
        self.sock.close()


@dataclass
class Cadence:
    """When a rank's next message of one kind is due, learnt from the intervals it has seen (a
    Generator: between a group's requests; a Simulator: from a request to its reply).

    A woken rank pays the operating system's wake-up on every hop (~0.05-0.1 ms on a VM), and
    spinning all the time burns a core. A rank that knows when a message is due spins only inside
    `window` (the usual interval, give or take twice its usual miss, at most `most` either side)
    and sleeps on its doorbell otherwise: at regular steps the message finds it awake for a
    fraction of a millisecond of polling per message, and a slow or irregular stream costs
    little (the window is capped) and loses nothing (the doorbell still wakes the rank)."""

    interval: float = 0.0   # seconds, an EWMA of the intervals seen (each clipped to 0.5x..2x it)
    miss: float = 0.0       # an EWMA of |interval seen - interval expected|
    seen: int = 0
    ALPHA = 0.125
    LEAST = 50e-6           # the narrowest half-window: the wake-up it saves

    def observe(self, seconds: float) -> None:
        if self.seen == 0:
            self.interval = seconds
        else:
            # A segment boundary or a reset makes a long gap now and then: it must not teach the
            # rank a new rhythm, nor widen its window to the gap.
            clipped = min(max(seconds, 0.5 * self.interval), 2.0 * self.interval)
            self.miss += self.ALPHA * (abs(clipped - self.interval) - self.miss)
            self.interval += self.ALPHA * (clipped - self.interval)
        self.seen += 1

    def window(self, since: float, most: float) -> tuple[float, float] | None:
        """(from, to) in `since`'s clock where the next message is expected, or None before the
        rhythm is known (3 intervals) or with `most` = 0."""
        if self.seen < 3 or most <= 0:
            return None
        half = min(most, self.LEAST + 2 * self.miss)
        due = since + self.interval
        return due - half, due + half


def earliest(windows, now: float) -> tuple[float, float] | None:
    """The first window that has not passed yet."""
    return min((w for w in windows if w is not None and w[1] >= now), default=None)


def sleep(timeout: float, fds: tuple = ()) -> bool:
    """The wait of a rank with no doorbell (`runtime.wake=sleep`, in-process runs): the whole
    timeout, whatever arrives meanwhile."""
    if timeout > 0:
        time.sleep(timeout)
    return False
