"""What each optimizer step trains: the shards announced for each rollout step, and Trainer 0's plan
of the current version's rows (their order, a cursor into it, how many optimizer steps are done).

Every Trainer keeps the announcements (to pre-read the shards it will most likely train and to
forget them once trained); only Trainer 0 plans, and sends each `TrainOrder` to the others.
Per version k: epoch 0 takes the step's shards in arrival order with `mode.streaming` (a step
starts once `global_batch` rows are announced), else in name order once the whole rollout step is
in (training then does not depend on message timing); later epochs revisit the step's shards in
an order shuffled from (seed, k, epoch). A mid-version checkpoint keeps the order and cursor
(`state`), so a resumed Trainer 0 continues with exactly the rows that follow.
"""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np

from .protocol import ShardReady, Slice, TrainOrder


def take_rows(order: list[tuple[str, int]], cursor: tuple[int, int], n: int, n_trainers: int):
    """Slices covering the next `n` rows of `order` [(shard, rows)] from `cursor` (index, row),
    cut so that Trainer j owns the j-th of n_trainers equal contiguous row ranges."""
    i, r = cursor
    taken = 0
    slices = []
    bounds = [n * (j + 1) // n_trainers for j in range(n_trainers)]  # end of each Trainer's range
    while taken < n and i < len(order):
        name, rows = order[i]
        owner = next(j for j, b in enumerate(bounds) if taken < b)
        k = min(n - taken, rows - r, bounds[owner] - taken)
        slices.append(Slice(name, r, r + k, owner))
        taken += k
        r += k
        if r == rows:
            i, r = i + 1, 0
    return slices, (i, r)


def position(order: list[tuple[str, int]], cursor: tuple[int, int]) -> int:
    """How many rows of `order` lie before `cursor`."""
    i, r = cursor
    return sum(rows for _, rows in order[:i]) + r


class RowPlan:
    def __init__(self, cfg, opt_steps_per_epoch: int, opt_steps_per_version: int, n_trainers: int):
        self.cfg, self.n_trainers = cfg, n_trainers
        self.per_epoch, self.per_version = opt_steps_per_epoch, opt_steps_per_version
        self.announced: dict[int, list[ShardReady]] = defaultdict(list)
        self.announced_names: set[str] = set()   # of the steps in `announced`
        self.order: list[tuple[str, int]] = []
        self.cursor = (0, 0)
        self.step_in_version = 0                 # optimizer steps of the current version planned

    def announce(self, msg: ShardReady, version: int) -> bool:
        """Count `msg` toward its rollout step; False if it is already trained or already counted
        (a duplicate after a restart, or seen in a resume's rescan and in a message sent meanwhile)."""
        if msg.rollout_step < version or msg.name in self.announced_names:
            return False
        self.announced_names.add(msg.name)
        self.announced[msg.rollout_step].append(msg)
        return True

    def next_order(self, version: int, opt_step: int) -> TrainOrder | None:
        """The next optimizer step of `version`, or None while its rows are not in yet."""
        a = self.cfg.algo
        epoch = self.step_in_version // self.per_epoch
        arrived = self.announced[version]
        if epoch == 0:
            streaming = self.cfg.mode.streaming
            ordered = arrived if streaming else sorted(arrived, key=lambda m: m.name)
            self.order = [(m.name, m.rows) for m in ordered]
            complete = sum(m.rows for m in arrived) >= a.rollout_batch
            avail = sum(r for _, r in self.order) - position(self.order, self.cursor)
            if not (complete or (streaming and avail >= a.global_batch)):
                return None
        elif self.step_in_version % self.per_epoch == 0:
            rng = np.random.default_rng([self.cfg.seed, version, epoch])
            names = sorted((m.name, m.rows) for m in arrived)
            self.order = [names[i] for i in rng.permutation(len(names))]
            self.cursor = (0, 0)
        slices, self.cursor = take_rows(self.order, self.cursor, a.global_batch, self.n_trainers)
        self.step_in_version += 1
        if self.step_in_version % self.per_epoch == 0:
            self.cursor = (0, 0)
        return TrainOrder(version, opt_step + 1, tuple(slices), end_of_version=self.step_in_version == self.per_version,
                          first_epoch=epoch == 0)

    def finish_version(self, version: int) -> list[ShardReady]:
        """The trained version's shards, no longer counted; the next version starts planning."""
        self.step_in_version = 0
        self.cursor = (0, 0)
        arrived = self.announced.pop(version, [])
        self.announced_names.difference_update(m.name for m in arrived)
        return arrived

    def rows_announced(self) -> dict[int, int]:
        return {k: sum(m.rows for m in v) for k, v in self.announced.items()}

    def state(self) -> dict:
        """What a mid-version checkpoint keeps of the plan (nothing at a version's end)."""
        if not self.step_in_version:
            return {}
        return {"step_in_version": self.step_in_version, "order": json.dumps(self.order), "cursor": list(self.cursor)}

    def restore(self, state: dict) -> None:
        if state.get("step_in_version", 0):
            self.step_in_version = int(state["step_in_version"])
            self.order = [(n, int(r)) for n, r in json.loads(state["order"])]
            self.cursor = tuple(int(x) for x in state["cursor"])
