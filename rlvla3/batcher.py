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
        return self.samples >= self.b_max or now - self.queue[0].arrived >= self.t_max

    def deadline(self) -> float | None:
        return self.queue[0].arrived + self.t_max if self.queue else None

    def pop(self) -> list[Request]:
        batch, total = [], 0
        while self.queue and total + self.queue[0].n <= self.b_max:
            req = self.queue.popleft()
            batch.append(req)
            total += req.n
        self.samples -= total
        return batch
