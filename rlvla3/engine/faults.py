"""Named fault points for `python -m rlvla3.bench faults`.

The benchmark arms one point for the ranks it starts with RLVLA3_FAULT=<point>:<n>; the process
that reaches that point for the n-th time SIGKILLs itself there, with no clean-up, as an OOM kill
or a lost node would. Kills from outside (the benchmark's own `kill`) cannot hit these windows on
purpose: each is milliseconds wide in a small run and minutes wide in a large one.
Unarmed (the variable unset, as in every real run), `reach` costs one dict lookup.
"""
from __future__ import annotations

import os
import signal

ENV_VAR = "RLVLA3_FAULT"
POINTS = {
    "shard_write": "a Simulator's shard is written to its temporary folder, not yet renamed",
    "ckpt_save": "the Trainer's checkpoint is saved to its .tmp file, not yet fsynced nor renamed",
    "weight_publish": "the Trainer sent a version's header and first bucket, not the rest",
}
_hits: dict[str, int] = {}


def armed() -> tuple[str, int] | None:
    """(point, n) from RLVLA3_FAULT, or None. A bad value is an error, not a silent no-op."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    point, _, n = value.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{ENV_VAR}={value!r}: expected <point>:<n> with n >= 1 and point one of {sorted(POINTS)}")
    return point, int(n)


def reach(point: str) -> None:
    """Die here if this is the armed point's n-th visit by this process."""
    if ENV_VAR not in os.environ:
        return
    target = armed()
    _hits[point] = _hits.get(point, 0) + 1
    if target == (point, _hits[point]):
        os.kill(os.getpid(), signal.SIGKILL)
