"""`python -m analysis.scaling <sweep folder>`: throughput vs GPUs for sync and async.

Reads the run folders a scaling sweep leaves (`g<G>-<mode>/`, each with config.yaml and
summary.json) and writes, into the sweep folder:
  scaling.csv  gpus, mode, steady env-steps/s, async/sync speedup, scaling efficiency
  scaling.png  throughput vs GPUs (both modes, log-log) and the async/sync speedup
Scaling efficiency = (throughput / G) / (throughput / G at the smallest G), per mode.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import yaml

from analysis.throughput import load


def gpus_of(run: Path) -> int:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    c = cfg["cluster"]
    return c["gen_ranks"] + (0 if cfg["mode"]["placement"] == "colocated" else c["train_ranks"])


def collect(sweep: Path) -> list[dict]:
    rows = []
    for run in sorted(p for p in sweep.iterdir() if (p / "summary.json").exists()):
        mode = yaml.safe_load((run / "config.yaml").read_text())["mode"]["name"]
        rows.append({"gpus": gpus_of(run), "mode": mode, "steps_per_s": load(run)["steady_steps_per_s"], "run": run.name})
    missing = [p.name for p in sweep.iterdir() if p.is_dir() and (p / "config.yaml").exists()
               and not (p / "summary.json").exists()]
    if missing:
        print(f"warning: no summary.json (the point failed or is running): {', '.join(missing)}", file=sys.stderr)
    base = {}
    for r in sorted(rows, key=lambda r: r["gpus"]):
        base.setdefault(r["mode"], r["steps_per_s"] / r["gpus"])
        r["efficiency"] = r["steps_per_s"] / r["gpus"] / base[r["mode"]]
    sync = {r["gpus"]: r["steps_per_s"] for r in rows if r["mode"] == "sync"}
    for r in rows:
        r["speedup_vs_sync"] = r["steps_per_s"] / sync[r["gpus"]] if r["gpus"] in sync else float("nan")
    return sorted(rows, key=lambda r: (r["gpus"], r["mode"]))


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in sorted({r["mode"] for r in rows}):
        pts = [(r["gpus"], r["steps_per_s"]) for r in rows if r["mode"] == mode]
        ax.plot(*zip(*pts), marker="o", label=mode)
    ax.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="env steps / s (steady state)", title="Throughput")
    ax.legend()
    sp = [(r["gpus"], r["speedup_vs_sync"]) for r in rows if r["mode"] == "async"]
    if sp:
        bx.plot(*zip(*sp), marker="o", color="C1")
    bx.axhline(1.0, color="grey", lw=0.8)
    bx.set(xscale="log", xlabel="GPUs", ylabel="async / sync", title="Speedup of async over sync")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path)
    a = ap.parse_args()
    rows = collect(a.sweep)
    if not rows:
        sys.exit(f"no finished run folders under {a.sweep}")
    keys = ["gpus", "mode", "steps_per_s", "speedup_vs_sync", "efficiency", "run"]
    with open(a.sweep / "scaling.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows({k: r[k] for k in keys} for r in rows)
    plot(rows, a.sweep / "scaling.png")
    for r in rows:
        print(f"{r['gpus']:4d} GPUs {r['mode']:6s} {r['steps_per_s']:9.1f} steps/s  "
              f"x{r['speedup_vs_sync']:.2f} vs sync  efficiency {r['efficiency']:.2f}")
    print(f"wrote {a.sweep / 'scaling.csv'} and {a.sweep / 'scaling.png'}")


if __name__ == "__main__":
    main()
