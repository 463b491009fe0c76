"""How a finished run went, in one line, and a sweep's runs in one table: what the launcher prints
last, so a user sees every result without opening a run folder."""
from __future__ import annotations

import math
from pathlib import Path

from .. import notices
from ..engine.metrics import read_history

COLUMNS = ("point", "overrides", "status", "versions", "env_steps_per_s", "final_success", "run_folder")


def run_result(run_dir: Path) -> dict:
    """versions trained, env steps/s over the run, the last version's training success."""
    history = read_history(run_dir)
    if not history:
        return {"versions": 0, "env_steps_per_s": math.nan, "final_success": math.nan}
    steps = sum(rec.get("env_steps", 0) for rec in history)
    wall = history[-1].get("t", math.nan)
    return {"versions": history[-1]["version"], "env_steps_per_s": steps / wall if wall and wall > 0 else math.nan,
            "final_success": history[-1].get("success", math.nan)}


def result_text(r: dict) -> str:
    """A run_result in words: the launcher's last line, and a sweep point's."""
    return f"{r['versions']} versions, {r['env_steps_per_s']:.1f} env steps/s, final success {r['final_success']:.2f}"


def result_line(run_dir: Path) -> str:
    return f"result: {result_text(run_result(run_dir))} (the last version's training episodes); run folder {run_dir}"


def failure_line(run_dir: Path) -> str | None:
    """The first exception a rank raised, as the console's last line of a failed run."""
    first = notices.first_failure(run_dir)
    return f"first error: {first}" if first else None


def sweep_table(rows: list[dict]) -> str:
    """One line per sweep point (a dict with COLUMNS' keys), as a markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_row(point: int, overrides: list[str], run_dir: Path, error: BaseException | None) -> dict:
    status = "ok" if error is None else "FAILED: " + (notices.first_failure(run_dir) or str(error).splitlines()[0])
    return {"point": point, "overrides": " ".join(overrides), "status": status, **run_result(run_dir),
            "run_folder": str(run_dir)}
