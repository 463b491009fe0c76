"""What every analysis plot shares: tick labels as plain numbers, and a title that says which run,
which mode and which code drew it.

matplotlib's defaults label a log axis `2×10^0` and move large linear values into an offset
(`1e6` in the corner); a reader of a scaling or learning plot wants `2, 4, 8` and `250000`.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def plain(value: float) -> str:
    """A tick value as a plain number: `8`, `1500`, `0.25`, `2,000,000` (never `1e+06` or `2×10^0`;
    thousands grouped from 10,000 on, where digits get hard to count)."""
    if abs(value) >= 10_000 and float(value).is_integer():
        return f"{value:,.0f}"
    return np.format_float_positional(float(value), precision=4, fractional=False, trim="-")


def plain_ticks(axis, ticks: list[float] | None = None, integer: bool = False) -> None:
    """Label `axis` (ax.xaxis / ax.yaxis) with plain numbers. With `ticks`: exactly those (e.g. the
    GPU counts measured) and no minor ticks, so a log axis shows no unlabelled in-betweens; else at
    most 6 round values (`integer`: whole ones, for counts), so wide labels like 1,500,000 fit."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter, NullLocator

    axis.set_major_formatter(FuncFormatter(lambda v, _: plain(v)))
    axis.set_minor_formatter(NullFormatter())
    if ticks is not None:
        axis.set_major_locator(FixedLocator(sorted(set(ticks))))
        axis.set_minor_locator(NullLocator())
    elif axis.get_scale() == "linear":
        axis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10], integer=integer))


def commit() -> str:
    """The checkout's commit (`+dirty` with uncommitted changes to tracked files), or '' outside
    git. Run folders do not record the code that ran them; the plots say which code drew them
    (the scaling test draws in the same job, from the same checkout, as its runs)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return ""
    return sha + ("+dirty" if dirty else "")


def drawn_by() -> str:
    """The title's last part: which code drew the plot."""
    sha = commit()
    return f"drawn at commit {sha}" if sha else "commit unknown"


def run_name(run: Path) -> str:
    """A run folder as its last two path parts (runs/<date>/<time>, <sweep>/g008-async)."""
    run = Path(run).resolve()
    return f"{run.parent.name}/{run.name}"


def run_title(run: Path, cfg: dict | None) -> str:
    """`<run> · mode async (eta 1) · toy / tiny_toy · drawn at commit abc1234`; cfg is the run
    folder's config.yaml as a dict (None: not readable)."""
    parts = [run_name(run)]
    if cfg:
        mode = cfg.get("mode", {})
        eta = f" (eta {mode['eta']})" if mode.get("name") == "async" and "eta" in mode else ""
        parts += [f"mode {mode.get('name', '?')}{eta}", f"{cfg.get('env', {}).get('name', '?')} / {cfg.get('policy', {}).get('name', '?')}"]
    return " · ".join([*parts, drawn_by()])


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks for a log axis from lo to hi: 1-2-5 per decade, finer where that leaves fewer than
    three (a narrow throughput range would otherwise show one label or none)."""
    import math

    ticks: list[float] = []
    for subs in ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9)):
        decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        ticks = [s * 10.0 ** k for k in decades for s in subs if lo <= s * 10.0 ** k <= hi]
        if len(ticks) >= 3:
            break
    return ticks


def wrapped(title: str, width: int = 70) -> str:
    """A title broken into lines of at most about `width` characters at its ` · ` separators (a
    small figure would cut a run's long title off at both edges)."""
    lines: list[str] = []
    for part in title.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return "\n".join(lines)
