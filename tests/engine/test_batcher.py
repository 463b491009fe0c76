"""Dynamic batcher semantics: B_max counts samples; the clock starts at the first arrival."""
import pytest

from rlvla3.engine.batcher import DynamicBatcher, WindowTuner
from rlvla3.engine.generator import Request


def req(gid, n, t):
    return Request(gid=gid, n=n, arrived=t, request_id=0, step=0, kind=0, obs={})


def test_closes_at_b_max_samples_not_requests():
    b = DynamicBatcher(b_max=8, t_max=1.0)
    b.add(req(0, 3, 0.0))
    b.add(req(1, 3, 0.0))
    assert not b.ready(0.0)          # 6 samples < 8, even with 2 requests
    b.add(req(2, 2, 0.0))
    assert b.ready(0.0)
    assert [r.gid for r in b.pop()] == [0, 1, 2]


def test_timeout_counts_from_first_arrival_not_from_wait_start():
    b = DynamicBatcher(b_max=100, t_max=0.010)
    assert not b.ready(5.0)          # nothing queued: no batch, however long we waited
    b.add(req(0, 1, 10.000))
    assert not b.ready(10.009)
    b.add(req(1, 1, 10.009))         # a later arrival does not restart the clock
    assert b.ready(10.0101)
    assert len(b.pop()) == 2


def test_never_exceeds_b_max_and_next_batch_clock_is_its_own_first_arrival():
    b = DynamicBatcher(b_max=4, t_max=1.0)
    b.add(req(0, 3, 0.0))
    b.add(req(1, 3, 0.5))
    assert b.ready(0.5)              # 6 queued >= 4: close
    batch = b.pop()
    assert [r.gid for r in batch] == [0] and sum(r.n for r in batch) <= 4
    assert not b.ready(1.4)          # remaining request arrived at 0.5: its clock runs to 1.5
    assert b.ready(1.5)


def test_oversized_request_is_refused():
    with pytest.raises(ValueError, match="B_max"):
        DynamicBatcher(b_max=2, t_max=0.0).add(req(0, 3, 0.0))


def test_ready_at_its_own_deadline_despite_float_rounding():
    # (a + 5) - a < 5 in floats for this a: a loop that sleeps until deadline() must then find
    # the batch ready (the planner's DES once spun forever on zero-length timeouts here).
    a = 1020.3172822707107
    assert (a + 5.0) - a < 5.0
    b = DynamicBatcher(b_max=8, t_max=5.0)
    b.add(req(0, 1, a))
    assert b.ready(b.deadline())


def test_window_tuner_targets_a_batch_size_at_the_observed_rate():
    # Requests of 2 samples every 10 ms = 200 samples/s: a batch of 8 needs 6 more samples
    # after its first request, 30 ms; capped at t_cap; recomputed once per period.
    t = WindowTuner(target=8, t_cap=0.1, period=0.25)
    now = 0.0
    for _ in range(200):
        now += 0.01
        t.observe(now, 2)
    assert abs(t.rate - 200.0) < 1e-6 and abs(t.window - 0.03) < 1e-9
    t2 = WindowTuner(target=8, t_cap=0.02, period=0.25)
    for k in range(100):
        t2.observe(0.01 * (k + 1), 2)
    assert t2.window == 0.02      # wanted 30 ms, capped at 20 ms
    # Twice the rate: half the window, after the smoothing has converged.
    for _ in range(2000):
        now += 0.005
        t.observe(now, 2)
    assert abs(t.window - 0.015) < 1e-3
