"""Which task a GRPO group's next episode runs (env.task_sampling), for multi-task runs
(env.task_ids with several tasks; LIBERO maps a reset seed to task_ids[seed % n]).

- uniform: the group's seed as drawn (world.group_seed), so tasks come round in proportion;
- failure: each task drawn in proportion to its recent failure rate (1 - success over its last
  env.task_sampling_window episodes on this Simulator rank; a task not yet seen counts as
  failing), never below env.task_sampling_floor, so a task that is learned keeps being
  rehearsed and none starves. The choice is a deterministic function of the group's seed and the
  rank's record, and it keeps the seed's initial-state part: the seed is moved to the chosen
  task's residue (seed - seed % n + i), so the task changes and (seed // n) does not.

Every Simulator rank keeps its own record (no messages): each samples every task, so its record
estimates the same rates from its share of the episodes.
"""
from __future__ import annotations

from collections import deque

import numpy as np


class TaskCurriculum:
    def __init__(self, task_ids: list[int], mode: str, floor: float, window: int):
        self.task_ids, self.mode, self.floor = list(task_ids), mode, floor
        self.recent = {t: deque(maxlen=window) for t in self.task_ids}

    def record(self, task: int, success: bool) -> None:
        """One ended episode of `task`."""
        if task in self.recent:
            self.recent[task].append(bool(success))

    def weights(self) -> np.ndarray:
        """Each task's draw probability, in task_ids order."""
        if self.mode == "uniform":
            w = np.ones(len(self.task_ids))
        else:
            fail = np.array([1.0 - float(np.mean(r)) if r else 1.0 for r in self.recent.values()])
            w = np.maximum(fail, self.floor)
        return w / w.sum()

    def seed_for(self, seed: int) -> int:
        """The reset seed of a group's next episode, from the seed it would use (`seed`)."""
        if self.mode == "uniform" or len(self.task_ids) == 1:
            return seed
        n = len(self.task_ids)
        i = int(np.random.default_rng(seed).choice(n, p=self.weights()))
        return seed - seed % n + i
