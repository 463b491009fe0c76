"""The Trainer's console: a line per version, or, when the user's console is a terminal, one
bar redrawn in place; both say when the run should end (ETA from this run's own pace)."""
from __future__ import annotations

import time

BAR = 24   # characters


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    def __init__(self, max_versions: int, first_version: int, tty: bool, label: str = "train"):
        self.max_versions, self.first, self.tty = max_versions, first_version, tty
        self.label = label   # "eval" for an evaluation run: its versions are rounds of episodes, not training
        self.t0 = time.monotonic()
        self.open_bar = False   # a bar is drawn and its line not yet ended

    def eta(self, version: int) -> float | None:
        """Seconds left at this run's mean version time so far (None before the first)."""
        done = version - self.first
        if done <= 0:
            return None
        return (time.monotonic() - self.t0) / done * (self.max_versions - version)

    def show(self, version: int, stats: str) -> None:
        eta = self.eta(version)
        left = "done" if version >= self.max_versions else f"ETA {clock(eta)}" if eta is not None else "ETA ?"
        if not self.tty:
            print(f"[{self.label}] version {version:4d}/{self.max_versions} | {stats} | {left}", flush=True)
            return
        fill = BAR * version // max(self.max_versions, 1)
        end = "\n" if version >= self.max_versions else ""
        print(f"\r[{self.label}] {'#' * fill}{'.' * (BAR - fill)} {version}/{self.max_versions} | {stats} | {left}\x1b[K",
              end=end, flush=True)
        self.open_bar = not end

    def note(self, line: str) -> None:
        """A line of its own between versions (an evaluation's result); a bar is redrawn below it
        at the next version."""
        if self.open_bar:
            print("\r\x1b[K", end="")
        print(line, flush=True)
        self.open_bar = False

    def close(self) -> None:
        """End a bar's line (a run stopped before its last version: preemption, failure)."""
        if self.open_bar:
            print(flush=True)
            self.open_bar = False
