"""Print steady-state throughput and per-span busy time of run folders (and plot them with
--plot out.png). Reads only files a run leaves behind."""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def load(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    from rlvla3.engine.metrics import read_summaries

    spans = defaultdict(float)
    for rec in read_summaries(run):
        for name, (_, seconds) in rec["spans"].items():
            spans[f"{rec['role']}:{name}"] += seconds
    h = summary["history"]
    steady = sum(x["env_steps"] for x in h[1:]) / (h[-1]["t"] - h[0]["t"]) if len(h) > 1 else float("nan")
    return {"run": str(run), "steady_steps_per_s": steady, "versions": summary["versions"], "spans": dict(spans),
            "history": h}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    rows = [load(r) for r in a.runs]
    for r in rows:
        print(f"{r['run']}: {r['steady_steps_per_s']:.1f} env steps/s over {r['versions']} versions")
        for k, v in sorted(r["spans"].items()):
            print(f"    {k:32s} {v:8.2f} s")
    if a.plot:
        plot(rows, a.plot)


def plot(rows: list[dict], out: Path) -> None:
    """Rows trained vs time, one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.figures import drawn_by, plain_ticks, run_name

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.plot([x["t"] for x in r["history"]], [x["rows_trained"] for x in r["history"]], marker=".",
                label=f"{run_name(Path(r['run']))}: {r['steady_steps_per_s']:.1f} env steps/s")
    ax.set(xlabel="seconds since the Trainer started (at the end of each version)", ylabel="rows trained (count)")
    ax.set_title(f"Rows trained · {drawn_by()}", fontsize=10)
    plain_ticks(ax.xaxis)
    plain_ticks(ax.yaxis, integer=True)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
