"""The one interface every role implements: what a rank's main loop (`run.drive`) calls on its
Simulator, Generator and Trainer objects, pass after pass.

A role never blocks: `step` does whatever can be done now (answer a message, step envs whose
actions arrived, train a micro-batch) and says whether it did anything. When no role of a rank did,
the rank sleeps (`transport.backoff.idle`) until the earliest `deadline`, data on a `wake_fds`
descriptor, a message's doorbell, or the moment a role `expecting` a message asks to poll for it.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Role(Protocol):
    done: bool
    """True once the role has finished its part of the run; the rank ends when all its roles have."""

    def step(self) -> bool:
        """Do what can be done without waiting; True if anything was."""

    def deadline(self) -> float | None:
        """The monotonic time by which the role must be stepped again (a batch's T_max, a timeout), or None."""

    def wake_fds(self) -> tuple:
        """File descriptors whose data the role waits for (env children's pipes): an idle rank wakes on them."""

    def expecting(self) -> tuple[float, float] | None:
        """(when, how sure) the role's next message is due, so the rank polls around it instead of sleeping."""

    def describe(self) -> str:
        """What the role is waiting for, in one line (the rank's report when it makes no progress)."""
