"""The doorbell (engine/doorbell.py): a ring ends an idle wait early, a lost ring costs the
timeout and nothing else, and who can ring whom; and `bench latency` over real engine jobs."""
from __future__ import annotations

import json
import threading
import time

import pytest

from rlvla3.engine.doorbell import Cadence, Doorbell, earliest
from rlvla3.engine.transport import Backoff
from tests.conftest import needs_mpi


def pair() -> tuple[Doorbell, Doorbell]:
    a, b = Doorbell(), Doorbell()
    addresses = [a.address(), b.address()]
    a.connect(addresses, 0)
    b.connect(addresses, 1)
    return a, b


def test_a_ring_ends_the_wait_and_is_drained():
    a, b = pair()
    try:
        timer = threading.Timer(0.05, a.ring, args=(1,))
        timer.start()
        t0 = time.monotonic()
        assert b.wait(30.0) is True
        assert time.monotonic() - t0 < 29.0, "the ring did not wake the waiting rank"
        assert b.rings == 1
        assert b.wait(0.01) is False, "a ring was left in the socket: the next wait ended early"
    finally:
        a.close()
        b.close()


def test_data_on_a_watched_file_ends_the_wait(tmp_path):
    import os

    a, _ = pair()
    r, w = os.pipe()
    try:
        threading.Timer(0.05, os.write, args=(w, b"x")).start()
        assert a.wait(30.0, (r,)) is True
    finally:
        os.close(r)
        os.close(w)
        a.close()


def test_without_a_ring_the_wait_lasts_its_timeout():
    a, b = pair()
    try:
        t0 = time.monotonic()
        assert b.wait(0.2) is False
        assert time.monotonic() - t0 >= 0.19
    finally:
        a.close()
        b.close()


def test_a_rank_rings_itself_from_another_thread():
    """The Simulator's shard writer thread wakes its own rank when a shard is on disk."""
    a, b = pair()
    try:
        threading.Timer(0.05, b.ring, args=(1,)).start()
        assert b.wait(30.0) is True
    finally:
        a.close()
        b.close()


def test_peers_on_other_hosts_ring_the_resolved_address_and_loopback_hosts_are_not_rung():
    bell = Doorbell()
    try:
        bell.host, bell.ip = "node1", ""   # this host's name resolves to a loopback address
        bell.connect([("node1", "", 5000), ("node1", "", 5001), ("node2", "10.0.0.2", 5002), ("node3", "", 5003)], 1)
        assert bell.peers[0] == ("127.0.0.1", 5000)
        assert bell.peers[2] == ("10.0.0.2", 5002)
        assert 3 not in bell.peers            # no address to ring: it finds messages by polling
        assert bell.reachable is False        # node2/node3 cannot ring node1: keep the short ceiling
        bell.ip = "10.0.0.1"
        bell.connect([("node1", "10.0.0.1", 5000), ("node2", "10.0.0.2", 5002)], 0)
        assert bell.reachable is True
        bell.ring(3)                          # an unknown peer: nothing sent, nothing raised
    finally:
        bell.close()


def test_backoff_looks_again_at_once_after_an_early_wake():
    woke = []

    def wait(timeout, fds):
        woke.append(timeout)
        return True          # as if rung

    b = Backoff(0.0005, 0.05, wait=wait)
    b.idle()
    assert woke == [0.0005]
    for _ in range(Backoff.SPINS_AFTER_WAKE):
        b.idle()             # Open MPI needs a few progress calls to show the message
    assert len(woke) == 1
    b.idle()
    assert len(woke) == 2 and woke[1] == 0.0005, "after an early wake the backoff restarts from the shortest wait"


def test_a_cadence_learns_the_interval_and_a_long_gap_does_not_teach_it_a_new_one():
    c = Cadence()
    for _ in range(2):
        c.observe(0.005)
    assert c.window(10.0, 0.0005) is None, "two intervals are not yet a rhythm"
    for _ in range(20):
        c.observe(0.005)
    lo, hi = c.window(10.0, 0.0005)
    assert lo < 10.005 < hi and hi - lo == pytest.approx(2 * Cadence.LEAST), "a steady stream: the narrowest window"
    assert c.window(10.0, 0.0) is None, "expect_spin_us=0 never spins"
    c.observe(1.0)    # a segment boundary: 200x the interval
    assert c.interval <= 0.005 * (1 + Cadence.ALPHA) + 1e-12, "one long gap moved the rhythm more than a clipped step"
    lo, hi = c.window(10.0, 0.0005)
    assert hi - lo <= 2 * 0.0005 + 1e-12, "the window is capped at expect_spin_us either side"
    assert earliest([None, (1.0, 2.0), (0.5, 0.9), (3.0, 4.0)], now=0.95) == (1.0, 2.0), "a passed window is skipped"


def test_backoff_polls_inside_an_expected_window_and_does_not_sleep_into_one():
    waits = []

    def wait(timeout, fds):
        waits.append(timeout)
        return False

    b = Backoff(0.0005, 0.05, wait=wait)
    now = time.monotonic()
    b.idle(expect=(now - 1.0, now + 60.0))
    assert waits == [], "inside the window a pass looks again without waiting"
    b.cur = 0.05
    b.idle(expect=(now + 60.0, now + 61.0))
    assert waits == [0.05], "a window far off: the usual wait"
    b.idle(expect=(time.monotonic() + 0.002, time.monotonic() + 0.003))
    assert 0 < waits[-1] <= 0.002, "the wait ends where the window opens"


@needs_mpi
@pytest.mark.slow
def test_bench_latency_measures_every_wake_over_real_engine_jobs(tmp_path):
    from rlvla3.benchmarks.cli import main

    assert main(["latency", "--topologies", "1+1", "--wakes", "doorbell,doorbell+expect", "--requests", "60",
                 "--idle-seconds", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "latency.json").read_text())
    assert [(r["topology"], r["wake"]) for r in rows] == [
        ("1+1", "doorbell"), ("1+1", "doorbell+expect"), ("idle", "doorbell"), ("idle", "doorbell+expect"),
        ("floor", "doorbell"), ("floor", "spin")]
    for r in rows:
        assert r["requests"] >= 40, r
        assert 0 < r["p50_ms"] <= r["p99_ms"], r
        if r["topology"] != "floor":
            assert set(r["cpu"]) == {"simulator", "generator", "trainer"}
            assert all(0 < c < 2 for c in r["cpu"].values()), r["cpu"]
