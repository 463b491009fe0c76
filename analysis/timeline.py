"""`python -m analysis.timeline <run folder>`: what every rank did, when.

Writes into the run folder:
  timeline.png / timeline.csv    per-rank Gantt of spans (sim_step, wait_action, infer,
                                 batch_wait, train, weight_sync, ...) on rank 0's clock
  batches.png  / batches.csv     Generator batch sizes (samples per forward) and forward times
  staleness.png / staleness.csv  per sample: rollout step minus the behaviour version (from shards)
  learning.png / learning.csv    success rate and env steps per version (summary.json, or the
                                 metrics of a run stopped before it)
  window.png   / window.csv      the batching window each Generator chose over time (only for
                                 runs with generator.adapt_batch, which log scalar t_max_ms)
Span times are already on rank 0's clock (metrics.py applies each rank's measured offset).
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

import numpy as np

SPAN_COLORS = {"sim_step": "C0", "reset": "C9", "wait_action": "0.85", "infer": "C1", "batch_wait": "0.7",
               "train": "C2", "load_shard": "C5", "weight_sync": "C3", "shard_write": "C4", "comm": "C6"}


def read_records(run: Path, kind: str):
    from rlvla3.engine.metrics import read_records

    return read_records(run, kind)


def read_history(run: Path) -> list[dict]:
    from rlvla3.engine.metrics import read_history

    return read_history(run)


def read_spans(run: Path) -> list[dict]:
    from rlvla3.engine.metrics import read_spans

    return [{"rank": rank, "role": role, "name": rec["n"], "start": rec["t"], "seconds": rec["d"],
             "batch": rec.get("batch", "")} for rank, role, rec in read_spans(run)]


def staleness(run: Path) -> Counter:
    """Samples per (rollout step - behaviour version), from every published shard."""
    from rlvla3.engine import shards

    out: Counter = Counter()
    for name in shards.scan(run / "shards"):
        step = shards.parse_name(name)[0]
        versions = shards.read_shard(run / "shards" / name)[0]["versions"]
        for v, n in zip(*np.unique(step - versions, return_counts=True)):
            out[int(v)] += int(n)
    return out


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        w.writeheader()
        w.writerows(rows)


def plot_timeline(spans: list[dict], out: Path) -> None:
    import matplotlib.pyplot as plt

    t0 = min(s["start"] for s in spans)
    ranks = sorted({(s["rank"], s["role"]) for s in spans})
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.45 * len(ranks)))
    for y, (rank, role) in enumerate(ranks):
        for name, color in SPAN_COLORS.items():
            bars = [(s["start"] - t0, s["seconds"]) for s in spans if s["rank"] == rank and s["name"] == name]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(ranks)), [f"{r} {role}" for r, role in ranks])
    ax.set_xlabel("seconds (rank 0 clock)")
    handles = {n: plt.Rectangle((0, 0), 1, 1, color=c) for n, c in SPAN_COLORS.items()
               if any(s["name"] == n for s in spans)}
    ax.legend(handles.values(), handles.keys(), ncol=min(len(handles), 5), loc="upper center",
              bbox_to_anchor=(0.5, -0.25), fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_hist(pairs: list[tuple[float, float]], xlabel: str, title: str, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    if pairs:
        ax.bar([p[0] for p in pairs], [p[1] for p in pairs])
    ax.set(xlabel=xlabel, ylabel="count", title=title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_window(windows: list[dict], t0: float, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for rank in sorted({w["rank"] for w in windows}):
        mine = [w for w in windows if w["rank"] == rank]
        ax.plot([w["t"] - t0 for w in mine], [w["t_max_ms"] for w in mine], marker=".", label=f"generator rank {rank}")
    ax.set(xlabel="seconds (rank 0 clock)", ylabel="T_max (ms)", title="Online batching window")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    run = ap.parse_args().run
    spans = read_spans(run)
    if not spans:
        raise SystemExit(f"no spans under {run / 'metrics'}: is this a run folder?")
    write_csv(run / "timeline.csv", spans)
    plot_timeline(spans, run / "timeline.png")

    infer = [s for s in spans if s["name"] == "infer"]
    sizes = Counter(int(s["batch"]) for s in infer)
    write_csv(run / "batches.csv", [{"batch": b, "count": n, "mean_forward_ms":
                                     1e3 * float(np.mean([s["seconds"] for s in infer if int(s["batch"]) == b]))}
                                    for b, n in sorted(sizes.items())])
    plot_hist(sorted(sizes.items()), "samples per forward", "Generator batch sizes", run / "batches.png")

    stale = staleness(run)
    write_csv(run / "staleness.csv", [{"versions_behind": k, "samples": n} for k, n in sorted(stale.items())])
    plot_hist(sorted(stale.items()), "rollout step - behaviour version", "Sample staleness", run / "staleness.png")

    hist = read_history(run)
    write_csv(run / "learning.csv", [{k: h[k] for k in ("version", "t", "env_steps", "episodes", "success")} for h in hist])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(np.cumsum([h["env_steps"] for h in hist]), [h["success"] for h in hist], marker=".")
    ax.set(xlabel="env steps", ylabel="success rate", title="Learning curve")
    fig.tight_layout()
    fig.savefig(run / "learning.png", dpi=110)
    windows = [{"rank": rank, "t": rec["t"], "t_max_ms": rec["v"], "samples_per_s": rec.get("rate", "")}
               for rank, _, rec in read_records(run, "scalar") if rec["n"] == "t_max_ms"]
    if windows:
        write_csv(run / "window.csv", windows)
        plot_window(windows, min(s["start"] for s in spans), run / "window.png")
    print(f"{len(spans)} spans from {len({s['rank'] for s in spans})} ranks; batch sizes {dict(sorted(sizes.items()))}; "
          f"staleness {dict(sorted(stale.items()))}; wrote timeline/batches/staleness/learning .png + .csv in {run}")


if __name__ == "__main__":
    main()
