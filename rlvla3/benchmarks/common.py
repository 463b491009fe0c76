"""What several benchmarks share: where their rows go, which families they run, a robust timer."""
from __future__ import annotations

import json
from pathlib import Path


def save_rows(out: str, name: str, rows: list[dict]) -> None:
    """A benchmark's rows as JSON in --out (nothing without --out)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(rows, indent=1))


def chosen_families(arg: str, runs: dict) -> list[str]:
    """--families: a comma list of names in `runs` (empty: all of them); an unknown name stops the bench."""
    names = arg.split(",") if arg else list(runs)
    unknown = sorted(set(names) - set(runs))
    if unknown:
        raise SystemExit(f"--families {','.join(unknown)}: not one of {','.join(runs)}")
    return names


def median_seconds(fn, repeats: int) -> float:
    import time

    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()   # warm-up (allocations, lazy init)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


