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
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        for r in rows:
            plt.plot([x["t"] for x in r["history"]], [x["rows_trained"] for x in r["history"]], label=r["run"])
        plt.xlabel("seconds")
        plt.ylabel("rows trained")
        plt.legend()
        plt.savefig(a.plot)


if __name__ == "__main__":
    main()
