"""The dynamic batcher, shared by the Generator and the planner's simulation of it (numpy-free,
torch-free). Requests are any objects with `n` (samples) and `arrived` (time it became eligible).
"""
from __future__ import annotations

from collections import deque
from typing import Protocol


class Request(Protocol):
    n: int            # samples
    arrived: float    # time it became eligible for batching (the batch clock starts here)


class DynamicBatcher:
    """FIFO requests -> batches of at most `b_max` samples.

    A batch closes when it holds b_max samples (or the next request would not fit), or when
    `t_max` seconds have passed since *its first request arrived* (not since the wait began:
    with that, tiny timeouts degenerate to batches of one request).
    """

    def __init__(self, b_max: int, t_max: float):
        self.b_max, self.t_max = b_max, t_max
        self.queue: deque[Request] = deque()
        self.samples = 0

    def add(self, req: Request) -> None:
        if req.n > self.b_max:
            raise ValueError(f"request of {req.n} samples exceeds B_max={self.b_max}")
        self.queue.append(req)
        self.samples += req.n

    def ready(self, now: float) -> bool:
        if not self.queue:
            return False
        # The same sum as deadline(): a caller that sleeps until deadline() then finds it ready
        # (now - arrived >= t_max can be False there by float rounding, and loop forever).
        return self.samples >= self.b_max or now >= self.queue[0].arrived + self.t_max

    def deadline(self) -> float | None:
        return self.queue[0].arrived + self.t_max if self.queue else None

    def pop(self, limit: int | None = None) -> list[Request]:
        """The next batch: whole requests in FIFO order, at most b_max (and `limit`) samples."""
        cap = self.b_max if limit is None else min(self.b_max, limit)
        batch, total = [], 0
        while self.queue and total + self.queue[0].n <= cap:
            req = self.queue.popleft()
            batch.append(req)
            total += req.n
        self.samples -= total
        return batch


class WindowTuner:
    """Online batching window (beyond the paper's fixed T_max): the T_max that lets a batch
    gather `target` samples at the arrival rate the Generator observes.

    Every `period` seconds the samples that arrived are turned into a rate, smoothed
    exponentially (weight `smoothing` on the newest period); the window is the time the rest of
    a target batch takes to arrive after its first request, (target - mean request) / rate,
    clamped to [0, t_cap]. No arrivals: the window is t_cap (nothing to wait for anyway).
    """

    def __init__(self, target: int, t_cap: float, period: float = 0.25, smoothing: float = 0.3):
        if target < 1:
            raise ValueError(f"target batch {target} must be >= 1")
        self.target, self.t_cap, self.period, self.smoothing = target, t_cap, period, smoothing
        self.rate = 0.0          # samples/s, smoothed
        self.mean_request = 1.0  # samples per request, smoothed
        self._samples = self._requests = 0
        self._since: float | None = None
        self.window = t_cap

    def observe(self, now: float, n: int) -> bool:
        """A request of n samples arrived at `now`; True when the window was re-computed."""
        if self._since is None:  # the clock starts here; rates count arrivals in (since, now]
            self._since = now
            return False
        self._samples += n
        self._requests += 1
        elapsed = now - self._since
        if elapsed < self.period:
            return False
        w = self.smoothing if self.rate > 0 else 1.0
        self.rate = (1 - w) * self.rate + w * self._samples / elapsed
        self.mean_request = (1 - w) * self.mean_request + w * self._samples / self._requests
        self._samples = self._requests = 0
        self._since = now
        wanted = max(self.target - self.mean_request, 0.0) / self.rate
        self.window = min(self.t_cap, wanted)
        return True
