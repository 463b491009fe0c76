"""`python -m analysis.timeline <run folder>`: what every rank did, when.

Writes into the run folder:
  timeline.png / timeline.csv    per-rank Gantt of spans (sim_step, wait_action, infer,
                                 batch_wait, train, weight_sync, ...) on rank 0's clock
  batches.png  / batches.csv     Generator batch sizes (samples per forward) and forward times
  staleness.png / staleness.csv  per sample: rollout step minus the behaviour version (from shards)
  learning.png / learning.csv    training success rate per version with its 95% Wilson interval
                                 (over that version's episodes) vs env steps (summary.json, or
                                 the metrics of a run stopped before it)
  window.png   / window.csv      the batching window each Generator chose over time (only for
                                 runs with generator.adapt_batch, which log scalar t_max_ms)
Span times are already on rank 0's clock (metrics.py applies each rank's measured offset). Every
plot's title names the run, its mode and the commit that drew it; ticks are plain numbers.
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

from analysis.figures import plain_ticks, run_title, wrapped

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


def plot_timeline(spans: list[dict], title: str, out: Path) -> None:
    import matplotlib.pyplot as plt

    t0 = min(s["start"] for s in spans)
    ranks = sorted({(s["rank"], s["role"]) for s in spans})
    handles = {n: plt.Rectangle((0, 0), 1, 1, color=c) for n, c in SPAN_COLORS.items()
               if any(s["name"] == n for s in spans)}
    # tall enough for the ranks and for the legend beside them
    fig, ax = plt.subplots(figsize=(12, max(0.8 + 0.45 * len(ranks), 0.9 + 0.22 * len(handles))))
    for y, (rank, role) in enumerate(ranks):
        for name, color in SPAN_COLORS.items():
            bars = [(s["start"] - t0, s["seconds"]) for s in spans if s["rank"] == rank and s["name"] == name]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(ranks)), [f"{r} {role}" for r, role in ranks])
    ax.set(xlabel="seconds since the first span (rank 0's clock)", ylabel="rank", title=f"What each rank did · {title}")
    plain_ticks(ax.xaxis)
    ax.legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.005, 1), fontsize="small",
              title="span")   # beside the ranks: below them it covered the axis label of a short figure
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_hist(pairs: list[tuple[float, float]], labels: tuple[str, str, str], run: str, out: Path) -> None:
    """Counts per integer value (labels: x axis, y axis, title). Up to 16 bars, each gets a tick of
    its own value, so none sits between two ticks."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if pairs:
        ax.bar([p[0] for p in pairs], [p[1] for p in pairs])
    ax.set(xlabel=labels[0], ylabel=labels[1])
    ax.set_title(wrapped(f"{labels[2]} · {run}"), fontsize=9)
    plain_ticks(ax.xaxis, [p[0] for p in pairs] if 0 < len(pairs) <= 16 else None, integer=True)
    plain_ticks(ax.yaxis, integer=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_window(windows: list[dict], t0: float, title: str, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for rank in sorted({w["rank"] for w in windows}):
        mine = [w for w in windows if w["rank"] == rank]
        ax.plot([w["t"] - t0 for w in mine], [w["t_max_ms"] for w in mine], marker=".", label=f"generator rank {rank}")
    ax.set(xlabel="seconds since the first span (rank 0's clock)", ylabel="batching window T_max (ms)")
    ax.set_title(wrapped(f"Online batching window · {title}"), fontsize=9)
    plain_ticks(ax.xaxis)
    plain_ticks(ax.yaxis)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def learning_rows(hist: list[dict]) -> list[dict]:
    """Per version: env steps so far, success rate and its 95% Wilson interval over the version's
    episodes (a version with none has no rate)."""
    from rlvla3.tools.episodes import wilson

    rows, steps = [], 0
    for h in hist:
        steps += h["env_steps"]
        lo, hi = wilson(round(h["success"] * h["episodes"]), h["episodes"]) if h["episodes"] else (float("nan"),) * 2
        rows.append({"version": h["version"], "t": h["t"], "env_steps": h["env_steps"], "env_steps_total": steps,
                     "episodes": h["episodes"], "success": h["success"], "success_lo": lo, "success_hi": hi})
    return rows


def learning_figure(rows: list[dict], title: str):
    """Success per version with its Wilson band vs env steps (returned, not saved: tests read it)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = [r["env_steps_total"] for r in rows]
    ax.fill_between(x, [r["success_lo"] for r in rows], [r["success_hi"] for r in rows], color="C0", alpha=0.2,
                    label="95% Wilson interval (the version's episodes)")
    ax.plot(x, [r["success"] for r in rows], marker=".", color="C0", label="training success of each version")
    ax.set(xlabel="env steps (cumulative)", ylabel="success rate", ylim=(0, 1))
    ax.set_title(wrapped(f"Learning curve · {title}"), fontsize=9)
    plain_ticks(ax.xaxis)
    plain_ticks(ax.yaxis)
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    return fig


def plot_learning(rows: list[dict], title: str, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig = learning_figure(rows, title)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run_config(run: Path) -> dict | None:
    f = run / "config.yaml"
    return yaml.safe_load(f.read_text()) if f.is_file() else None


def write_batches(run: Path, spans: list[dict], title: str) -> Counter:
    infer = [s for s in spans if s["name"] == "infer"]
    sizes = Counter(int(s["batch"]) for s in infer)
    write_csv(run / "batches.csv", [{"batch": b, "count": n, "mean_forward_ms":
                                     1e3 * float(np.mean([s["seconds"] for s in infer if int(s["batch"]) == b]))}
                                    for b, n in sorted(sizes.items())])
    plot_hist(sorted(sizes.items()), ("samples per forward", "forwards (count)", "Generator batch sizes"), title, run / "batches.png")
    return sizes


def write_staleness(run: Path, title: str) -> Counter:
    stale = staleness(run)
    write_csv(run / "staleness.csv", [{"versions_behind": k, "samples": n} for k, n in sorted(stale.items())])
    plot_hist(sorted(stale.items()), ("versions behind (rollout step - behaviour version)", "samples (count)", "Sample staleness"),
              title, run / "staleness.png")
    return stale


def main(argv: list[str] | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    run = ap.parse_args(argv).run
    spans = read_spans(run)
    if not spans:
        raise SystemExit(f"no spans under {run / 'metrics'}: is this a run folder?")
    title = run_title(run, run_config(run))
    write_csv(run / "timeline.csv", spans)
    plot_timeline(spans, title, run / "timeline.png")
    sizes = write_batches(run, spans, title)
    stale = write_staleness(run, title)
    learning = learning_rows(read_history(run))
    write_csv(run / "learning.csv", learning)
    plot_learning(learning, title, run / "learning.png")
    windows = [{"rank": rank, "t": rec["t"], "t_max_ms": rec["v"], "samples_per_s": rec.get("rate", "")}
               for rank, _, rec in read_records(run, "scalar") if rec["n"] == "t_max_ms"]
    if windows:
        write_csv(run / "window.csv", windows)
        plot_window(windows, min(s["start"] for s in spans), title, run / "window.png")
    print(f"{len(spans)} spans from {len({s['rank'] for s in spans})} ranks; batch sizes {dict(sorted(sizes.items()))}; "
          f"staleness {dict(sorted(stale.items()))}; wrote timeline/batches/staleness/learning .png + .csv in {run}")


if __name__ == "__main__":
    main()
