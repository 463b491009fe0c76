"""`python -m analysis.scaling <sweep folder> [--profile P]`: throughput vs GPUs for sync and async.

Reads the run folders a scaling sweep leaves (`g<G>-<mode>/`, each with config.yaml, summary.json
and metrics/) and writes, into the sweep folder:
  scaling.csv  per point: GPUs, mode, steady env steps/s, async/sync speed-up, scaling efficiency,
               ideal linear scaling, the planner's prediction, and where the ranks ran (ranks,
               env processes, hosts, cores, oversubscribed)
  scaling.png  throughput vs GPUs (log-log, ticks at the measured GPU counts) with ideal linear
               scaling from the smallest point and the planner's prediction, and the async/sync
               speed-up; points measured oversubscribed are hollow
  hosts.json   cores of the hosts that ran ranks, as measured here (see `host_cores`)
Scaling efficiency = (throughput / G) / (throughput / G at the smallest G), per mode.
`python -m analysis.scaling <sweep>/scaling.csv [--out PNG]` redraws a CSV (older CSVs without the
newer columns: those facts are unknown and drawn as such).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import socket
import sys
from collections import Counter
from pathlib import Path

import yaml

from analysis.figures import drawn_by, log_ticks, plain_ticks, run_name
from analysis.throughput import load

KEYS = ["gpus", "mode", "steps_per_s", "speedup_vs_sync", "efficiency", "ideal_steps_per_s", "predicted_steps_per_s",
        "ranks", "env_procs", "hosts", "cores", "oversubscribed", "run"]
HOSTS_FILE = "hosts.json"
NAN = float("nan")


# ---------------------------------------------------------------- where the ranks ran


def gpus_of(cfg: dict) -> int:
    c = cfg["cluster"]
    return c["gen_ranks"] + (0 if cfg["mode"]["placement"] == "colocated" else c["train_ranks"])


def rank_hosts(run: Path) -> dict[int, str]:
    """rank -> the machine it ran on, from each rank's metrics meta record (the last one: a resumed
    rank writes one per attempt): the kernel's boot id where recorded, since the local test
    cluster's virtual nodes are one machine; else the host name."""
    return {rank: meta.get("machine") or meta.get("host", "?") for rank, meta in rank_metas(run).items()}


def rank_metas(run: Path) -> dict[int, dict]:
    out = {}
    for f in sorted((run / "metrics").glob("rank*.jsonl")):
        for line in f.read_text().splitlines():
            if '"k":"meta"' in line:  # metrics.py writes compact JSON; skip decoding the spans
                out[int(f.stem[4:])] = json.loads(line)
    return out


def host_cores(sweep: Path, hosts: set[str], runs: list[Path] = ()) -> dict[str, int]:
    """Cores of the machines that ran the sweep's ranks, where measured: each rank records its
    machine's cpus; sweeps from before that record are counted where the ranks ran (this host,
    when it ran ranks: slurm/scale_test.sh draws inside the allocation), kept in hosts.json for
    later redraws. Neither the config nor Slurm knows them: the local test cluster's virtual
    nodes declare 16 cores each and share the 2 of one machine."""
    measured = {meta.get("machine") or meta.get("host"): meta["cpus"] for run in runs
                for meta in rank_metas(run).values() if meta.get("cpus")}
    f = sweep / HOSTS_FILE
    known = json.loads(f.read_text()) if f.is_file() else {}
    me = socket.gethostname()
    if me in hosts and me not in known:
        known[me] = os.cpu_count() or 0
        f.write_text(json.dumps(known, indent=1) + "\n")
    return {**{h: int(c) for h, c in known.items() if c}, **measured}


def env_processes(world) -> dict[int, int]:
    """Simulator rank -> env child processes it spawned (none for in-process envs)."""
    if world.in_process_envs:
        return {}
    out: Counter = Counter()
    for g in world.groups:
        out[g.sim_rank] += g.size
    return dict(out)


def occupancy(hosts: dict[int, str], world, cores: dict[str, int]) -> dict:
    """ranks, env_procs, hosts, cores (of those hosts; None unless all measured) and
    oversubscribed (some host ran more ranks + env processes than it has cores; None: unknown)."""
    envs = env_processes(world) if world is not None else {}
    busy: Counter = Counter()
    for rank, host in hosts.items():
        busy[host] += 1 + envs.get(rank, 0)
    known = {h: cores[h] for h in busy if h in cores}
    over = any(busy[h] > c for h, c in known.items())
    complete = bool(busy) and len(known) == len(busy) and world is not None
    return {"ranks": world.size if world is not None else (len(hosts) or None),
            "env_procs": sum(envs.values()) if world is not None else None,
            "hosts": len(busy) or None,
            "cores": sum(known.values()) if complete else None,
            "oversubscribed": True if over else (False if complete else None)}


# ---------------------------------------------------------------- the planner's prediction


def load_profile(path: Path):
    """A planner profile: a YAML file (conf/profile/*.yaml), or fitted from a run folder."""
    if path.is_dir():
        from rlvla3.planner.measure import profile_from_run

        return profile_from_run(path)
    from rlvla3.planner import load_profile as load_yaml

    return load_yaml(path)


def point_layout(cfg, world):
    """The planner `Layout` of a measured point, or None where the point is not one the planner's
    layouts can express (groups of unequal size, or unevenly spread over ranks or Generators)."""
    from rlvla3.planner import Layout

    c, m = cfg.cluster, cfg.mode
    sizes = {g.size for g in world.groups}
    per_sim = set(Counter(g.sim_rank for g in world.groups).values())
    if len(sizes) != 1 or len(per_sim) != 1 or cfg.env.num_envs % c.gen_ranks:
        return None
    group, envs_per_gen = sizes.pop(), cfg.env.num_envs // c.gen_ranks
    if envs_per_gen % group:
        return None
    b_max = world.b_max if m.env_level else envs_per_gen   # lockstep: one batch of all a Generator's envs
    return Layout(c.gen_ranks, c.train_ranks, envs_per_gen, group, max(b_max, group), cfg.generator.t_max_ms, m.eta,
                  env_level=m.env_level, overlap=m.overlap, streaming=m.streaming, placement=m.placement,
                  groups_per_sim=per_sim.pop())


def predict(profile, cfg, world, run: Path) -> float:
    """The planner's DES prediction of the point's env steps/s (NaN where it has none)."""
    from rlvla3.planner import PlannerError, simulate

    layout = point_layout(cfg, world)
    if layout is None:
        print(f"warning: {run.name}: its layout is not one the planner models; no prediction", file=sys.stderr)
        return NAN
    try:
        return simulate(profile, layout).steps_per_s
    except PlannerError as e:
        print(f"warning: {run.name}: no prediction: {e}", file=sys.stderr)
        return NAN


# ---------------------------------------------------------------- the sweep


def point_world(run: Path):
    """(RunConfig, World) of a run folder, or (None, None) where this code cannot read its config
    (a sweep from an older schema: its occupancy and prediction are then unknown)."""
    from rlvla3 import config
    from rlvla3.world import derive

    try:
        cfg = config.load(run)
        return cfg, derive(cfg)
    except Exception as e:   # omegaconf's and config's errors alike: the point is still drawn
        print(f"warning: {run.name}: config not readable here ({type(e).__name__}: {e}); "
              f"ranks, cores and prediction unknown", file=sys.stderr)
        return None, None


def finished_runs(sweep: Path) -> list[Path]:
    runs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    missing = [p.name for p in sweep.iterdir() if p.is_dir() and (p / "config.yaml").exists()
               and not (p / "summary.json").exists()]
    if missing:
        print(f"warning: no summary.json (the point failed or is running): {', '.join(missing)}", file=sys.stderr)
    return runs


def add_ratios(rows: list[dict]) -> None:
    """Efficiency and ideal linear scaling from each mode's smallest point; async / sync."""
    base = {}
    for r in sorted(rows, key=lambda r: r["gpus"]):
        base.setdefault(r["mode"], r["steps_per_s"] / r["gpus"])
        r["efficiency"] = r["steps_per_s"] / r["gpus"] / base[r["mode"]]
        r["ideal_steps_per_s"] = base[r["mode"]] * r["gpus"]
    sync = {r["gpus"]: r["steps_per_s"] for r in rows if r["mode"] == "sync"}
    for r in rows:
        r["speedup_vs_sync"] = r["steps_per_s"] / sync[r["gpus"]] if r["gpus"] in sync else NAN


def collect(sweep: Path, profile=None) -> list[dict]:
    runs = finished_runs(sweep)
    hosts = {run: rank_hosts(run) for run in runs}
    cores = host_cores(sweep, {h for hs in hosts.values() for h in hs.values()}, runs)
    rows = []
    for run in runs:
        raw = yaml.safe_load((run / "config.yaml").read_text())
        cfg, world = point_world(run)
        rows.append({"gpus": gpus_of(raw), "mode": raw["mode"]["name"], "steps_per_s": load(run)["steady_steps_per_s"],
                     "run": run.name, **occupancy(hosts[run], world, cores),
                     "predicted_steps_per_s": predict(profile, cfg, world, run) if profile and world else NAN})
    add_ratios(rows)
    return sorted(rows, key=lambda r: (r["gpus"], r["mode"]))


# ---------------------------------------------------------------- the CSV


def cell(value) -> str:
    """A CSV cell: unknown (None, NaN) is empty; booleans are true/false."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=KEYS)
        w.writeheader()
        w.writerows({k: cell(r.get(k)) for k in KEYS} for r in rows)


def parse(key: str, text: str | None):
    """A CSV cell back (missing column or empty: None, or NaN for a measurement)."""
    text = (text or "").strip()
    if key in ("mode", "run"):
        return text
    if key == "oversubscribed":
        return {"true": True, "false": False}.get(text.lower())
    if key in ("gpus", "ranks", "env_procs", "hosts", "cores"):
        return int(text) if text else None
    return float(text) if text else NAN


def read_csv(path: Path) -> list[dict]:
    """scaling.csv back as rows; a column an older file lacks reads as unknown."""
    with open(path) as f:
        rows = [{k: parse(k, r.get(k)) for k in KEYS} for r in csv.DictReader(f)]
    if rows and all(math.isnan(r["ideal_steps_per_s"]) for r in rows):
        add_ratios(rows)   # older files: no ideal column
    return rows


# ---------------------------------------------------------------- the figure


def over_note(rows: list[dict]) -> str:
    """The figure's caption: which points were oversubscribed, which could not be checked."""
    over = [r for r in rows if r["oversubscribed"]]
    unknown = [r for r in rows if r["oversubscribed"] is None]
    lines = []
    if over:
        what = "; ".join(f"{r['gpus']} GPUs {r['mode']}: {busy(r)} on {r['cores'] or '?'} cores" for r in over)
        lines.append(f"Hollow: oversubscribed, more ranks + env processes than cores on a host ({what}). "
                     "Those points measure ranks sharing cores, not the GPU count.")
    if unknown:
        lines.append(f"Cores of the hosts not measured for {', '.join(sorted({str(r['gpus']) for r in unknown}, key=int))} "
                     "GPUs: oversubscription not checked there.")
    return "\n".join(lines)


def busy(r: dict) -> str:
    procs = f" + {r['env_procs']} env processes" if r.get("env_procs") else ""
    return f"{r['ranks'] if r['ranks'] is not None else '?'} ranks{procs}"


def draw_points(ax, pts: list[tuple[float, float, bool]], color: str, label: str) -> None:
    """A mode's measured points: joined by a line, filled where the point ran on enough cores,
    hollow where oversubscribed (pts: gpus, value, oversubscribed)."""
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, label=label)
    for hollow, tag in ((False, "filled"), (True, "hollow")):
        mine = [p for p in pts if bool(p[2]) == hollow]
        if mine:
            ax.plot([p[0] for p in mine], [p[1] for p in mine], "o", color=color, ms=7, mew=1.5,
                    mfc="white" if hollow else color, gid=f"{label} {tag}")


def draw_throughput(ax, rows: list[dict], modes: list[str], profile_name: str, no_prediction: str) -> None:
    from matplotlib.lines import Line2D

    g0 = min(r["gpus"] for r in rows)
    for i, mode in enumerate(modes):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["gpus"])
        color = f"C{i}"
        draw_points(ax, [(r["gpus"], r["steps_per_s"], r["oversubscribed"]) for r in mine], color, f"{mode} measured")
        ax.plot([r["gpus"] for r in mine], [r["ideal_steps_per_s"] for r in mine], ":", color=color, lw=1.5,
                label=f"{mode} ideal (linear from {mine[0]['gpus']} GPUs)", gid=f"{mode} ideal")
        pred = [(r["gpus"], r["predicted_steps_per_s"]) for r in mine if not math.isnan(r["predicted_steps_per_s"])]
        if pred:
            source = f"DES, profile {profile_name}" if profile_name else "DES"
            ax.plot(*zip(*pred), "--", marker="x", color=color, label=f"{mode} planner ({source})", gid=f"{mode} planner")
    if not any(not math.isnan(r["predicted_steps_per_s"]) for r in rows):
        ax.plot([], [], ls="none", label=f"no planner prediction ({no_prediction})")
    values = [v for r in rows for v in (r["steps_per_s"], r["ideal_steps_per_s"], r["predicted_steps_per_s"])
              if not math.isnan(v) and v > 0]
    ax.set(xscale="log", yscale="log", ylim=(min(values) / 1.3, max(values) * 1.3), xlabel="GPUs (Generator + Trainer ranks)",
           ylabel="env steps / s (steady state)", title=f"Throughput (ideal: smallest point x G / {g0})")
    plain_ticks(ax.yaxis, log_ticks(*ax.get_ylim()))
    handles = ax.get_legend_handles_labels()[0]
    if any(r["oversubscribed"] for r in rows):
        handles.append(Line2D([], [], ls="none", marker="o", mfc="white", color="grey", label="oversubscribed (hollow)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left")


def draw_speedup(bx, rows: list[dict]) -> None:
    sync = {r["gpus"]: r for r in rows if r["mode"] == "sync"}
    pairs = [(r, sync[r["gpus"]]) for r in rows if r["mode"] == "async" and r["gpus"] in sync]
    pts = [(a["gpus"], a["speedup_vs_sync"], a["oversubscribed"] or s["oversubscribed"]) for a, s in pairs]
    if pts:
        draw_points(bx, pts, "C1", "async / sync measured")
        for g, v, _ in pts:
            bx.annotate(f"{v:.2f}x", (g, v), textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    pred = [(a["gpus"], a["predicted_steps_per_s"] / s["predicted_steps_per_s"]) for a, s in pairs
            if not math.isnan(a["predicted_steps_per_s"]) and not math.isnan(s["predicted_steps_per_s"])]
    if pred:
        bx.plot(*zip(*pred), "--", marker="x", color="C1", label="async / sync planner (DES)", gid="speedup planner")
    bx.axhline(1.0, color="grey", lw=0.8, label="equal")
    values = [v for _, v in pred] + [v for _, v, _ in pts if not math.isnan(v)]
    # at least 0.75..1.25: a few percent of noise must not fill the panel
    bx.set(xscale="log", ylim=(min([0.75, *values]) * 0.95, max([1.25, *values]) * 1.08), xlabel="GPUs (Generator + Trainer ranks)",
           ylabel="async / sync throughput (x)", title="Speed-up of async over sync")
    plain_ticks(bx.yaxis)
    bx.legend(fontsize=8)


def figure(rows: list[dict], title: str, profile_name: str = "", no_prediction: str = "no --profile given"):
    """The scaling figure (returned, not saved: tests read its artists). profile_name names the
    planner profile of the predictions; no_prediction says why there are none."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows}, key=lambda m: (m != "sync", m))   # sync C0, async C1 in both panels
    gpus = sorted({r["gpus"] for r in rows})
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.2))
    draw_throughput(ax, rows, modes, profile_name, no_prediction)
    draw_speedup(bx, rows)
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xlim(gpus[0] / 1.4, gpus[-1] * 1.4)
        plain_ticks(a.xaxis, gpus)   # the GPU counts measured, as plain numbers
        a.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    note = over_note(rows)
    fig.tight_layout(rect=(0, 0.06 * (note.count("\n") + 1) if note else 0, 1, 1))
    if note:
        fig.text(0.01, 0.01, note, fontsize=8, va="bottom", wrap=True)
    return fig


def plot(rows: list[dict], out: Path, title: str, **kw) -> None:
    import matplotlib.pyplot as plt

    fig = figure(rows, title, **kw)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def sweep_title(sweep: Path, rows: list[dict]) -> str:
    cfg = yaml.safe_load((sweep / rows[0]["run"] / "config.yaml").read_text())
    return (f"Scaling sweep {run_name(sweep)} · {cfg['env']['name']} / {cfg['policy']['name']} · "
            f"{cfg['cluster']['name']} · {drawn_by()}")


def report(rows: list[dict]) -> None:
    for r in rows:
        over = {True: "OVERSUBSCRIBED", False: "", None: "cores unknown"}[r["oversubscribed"]]
        print(f"{r['gpus']:4d} GPUs {r['mode']:6s} {r['steps_per_s']:9.1f} steps/s  x{r['speedup_vs_sync']:.2f} vs sync  "
              f"efficiency {r['efficiency']:.2f}  planner {r['predicted_steps_per_s']:9.1f}  "
              f"{busy(r)} on {r['cores'] or '?'} cores {over}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="the sweep folder, or a scaling.csv to redraw")
    ap.add_argument("--profile", type=Path, help="planner profile (conf/profile/*.yaml, or a run folder to fit one "
                                                  "from): draws the planner's prediction of every point's layout")
    ap.add_argument("--out", type=Path, help="redrawing a CSV: the PNG (default: beside the CSV)")
    a = ap.parse_args(argv)
    if a.sweep.is_file():
        rows = read_csv(a.sweep)
        plot(rows, a.out or a.sweep.with_suffix(".png"), f"Scaling {a.sweep} (redrawn) · {drawn_by()}",
             no_prediction="none in this CSV")
        return 0
    profile = load_profile(a.profile) if a.profile else None
    rows = collect(a.sweep, profile)
    if not rows:
        sys.exit(f"no finished run folders under {a.sweep}")
    write_csv(rows, a.sweep / "scaling.csv")
    plot(rows, a.sweep / "scaling.png", sweep_title(a.sweep, rows), profile_name=profile.name if profile else "")
    report(rows)
    print(f"wrote {a.sweep / 'scaling.csv'} and {a.sweep / 'scaling.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
