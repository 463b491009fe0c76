"""analysis/: the timeline, batch-size, staleness and learning files of real engine runs (slow,
over MPI), and the plots themselves on small run and sweep folders written here (fast): plain-number
ticks, ideal scaling, the planner's prediction, oversubscribed points, Wilson intervals."""
from __future__ import annotations

import csv
import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlvla3.engine import shards
from tests.conftest import TOY, assert_ok, needs_mpi, run_engine

REPO = Path(__file__).resolve().parents[2]
PLAIN = re.compile(r"^-?[0-9]{1,3}(,?[0-9]{3})*(\.[0-9]+)?$")   # `8`, `1500`, `0.25`, `2,000,000`: no 10^k, e+06, ×


def rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@needs_mpi
@pytest.mark.slow
def test_timeline_batches_and_staleness_of_an_async_run(tmp_path):
    proc, run = run_engine(tmp_path, [*TOY, "mode=async", "mode.eta=1", "generator.b_max=8"])
    assert_ok(proc)
    out = subprocess.run([sys.executable, "-m", "analysis.timeline", str(run)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("timeline", "batches", "staleness", "learning"):
        assert (run / f"{name}.png").stat().st_size > 5_000 and (run / f"{name}.csv").exists()
    spans = rows(run / "timeline.csv")
    assert {"sim_step", "infer", "train", "weight_sync"} <= {s["name"] for s in spans}
    assert len({s["rank"] for s in spans}) == 3
    batches = rows(run / "batches.csv")
    assert batches and all(1 <= int(b["batch"]) <= 8 for b in batches)  # B_max is in samples
    stale = {int(r["versions_behind"]): int(r["samples"]) for r in rows(run / "staleness.csv")}
    assert set(stale) <= {0, 1}  # eta = 1 bounds it
    shard_rows = sum(shards.read_attrs(run / "shards" / n)["rows"] for n in shards.scan(run / "shards"))
    assert sum(stale.values()) == shard_rows > 0  # every published sample counted once
    assert len(rows(run / "learning.csv")) == 3


@needs_mpi
@pytest.mark.slow
def test_online_batching_window_is_tuned_logged_and_plotted(tmp_path):
    from tests.engine.test_emulated import EMULATED

    proc, run = run_engine(tmp_path, [*EMULATED, "generator.adapt_batch=8", "generator.t_max_ms=200"], name="adapt")
    assert_ok(proc)
    out = subprocess.run([sys.executable, "-m", "analysis.timeline", str(run)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (run / "window.png").stat().st_size > 5_000
    windows = rows(run / "window.csv")
    assert {w["rank"] for w in windows} == {"2", "3"}  # both Generator ranks tuned
    # Each Generator serves 4 envs (groups of 2), so a batch of 8 can never fill: the target is
    # capped at 4 and the window settles near one group step, far below the 200 ms cap (a
    # 50 ms cap was within reach of a group step on a loaded 2-core machine).
    for w in windows:
        wanted = float(w["t_max_ms"])
        assert 0 < wanted <= 200
    last = [float(w["t_max_ms"]) for w in windows][-1]
    assert last < 100, f"the window never came down near one group step: {windows[-5:]}"


@needs_mpi
@pytest.mark.slow
def test_a_run_killed_after_a_version_keeps_its_history_in_its_metrics(tmp_path):
    """A run stopped by hand (no summary.json) is read back from the lead Trainer's metrics
    (`read_history`, analysis.curves): every version up to its newest checkpoint must be there,
    equal to the history that checkpoint holds. A version's record used to wait in the buffer until
    the next version's weights went out, so a kill right after a version lost it."""
    import json
    import os
    import signal
    import time

    from rlvla3.cluster.compose import compose, prepare_run_dir
    from rlvla3.cluster.local import kill_session, mpi_env, mpiexec_command
    from rlvla3.engine.checkpoints import all_ckpts, load_torch
    from rlvla3.engine.metrics import read_history

    cfg, world = prepare_run_dir(compose([*TOY, "algo.max_versions=1000"]), tmp_path / "run")
    run = tmp_path / "run"
    proc = subprocess.Popen(mpiexec_command(cfg, world.size, run), env=mpi_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (run / "ckpt" / "v000002.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (run / "ckpt" / "v000002.pt").exists(), "the run never checkpointed version 2"
        os.killpg(proc.pid, signal.SIGKILL)   # at once: no rank flushes anything after this
    finally:
        kill_session(proc.pid)
        proc.wait(timeout=30)
    newest = all_ckpts(run / "ckpt")[-1]
    saved = json.loads(load_torch(newest)["history"])
    assert not (run / "summary.json").exists()
    got = read_history(run)[:len(saved)]
    assert json.dumps(got) == json.dumps(saved), (newest.name, len(got), len(saved))

    # A run from before that flush, its last version's records (and any later) lost: analysis.curves takes the
    # newest checkpoint's history instead.
    from analysis.curves import run_history

    for f in (run / "metrics").glob("rank*.jsonl"):
        lines = f.read_text().splitlines(keepends=True)
        f.write_text("".join(ln for ln in lines if json.loads(ln).get("version", 0) < len(saved) or json.loads(ln)["k"] != "scalar"))
    assert len(read_history(run)) == len(saved) - 1
    assert json.dumps(run_history(run)) == json.dumps(saved)


# ---------------------------------------------------------------- the plots on small folders written here


def write_metrics(run: Path, ranks: list[tuple[str, str]], spans: dict[int, list[dict]] | None = None) -> None:
    """metrics/rank*.jsonl as the engine writes them (compact JSON): a meta record naming the
    rank's role and host, its spans, its exit summary."""
    (run / "metrics").mkdir(parents=True, exist_ok=True)
    for rank, (role, host) in enumerate(ranks):
        recs = [{"k": "meta", "rank": rank, "role": role, "host": host, "pid": 1, "clock_offset": 0.0, "t": 0.0},
                *({"k": "span", **sp} for sp in (spans or {}).get(rank, [])),
                {"k": "summary", "rank": rank, "role": role, "spans": {}}]
        (run / "metrics" / f"rank{rank:04d}.jsonl").write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))


def write_summary(run: Path, env_steps: list[int], success: list[float], episodes: int = 20, dt: float = 10.0) -> None:
    history = [{"version": v + 1, "t": dt * v, "env_steps": n, "episodes": episodes, "success": s, "rows_trained": 0}
               for v, (n, s) in enumerate(zip(env_steps, success))]
    (run / "summary.json").write_text(json.dumps({"versions": len(history), "history": history}))


def scale_point(sweep: Path, gpus: int, mode: str, steps_per_s: float, host: str) -> Path:
    """One point of a scaling sweep as rlvla3.cluster.scale leaves it: the point's real config
    (G Simulators, G/2 Generators, G/2 Trainers), a 4-version history at `steps_per_s`, and
    every rank's metrics on `host`."""
    from rlvla3 import config
    from rlvla3.cluster.scale import point_config

    cfg = point_config(["+experiment=toy"], gpus, mode, 4)
    run = sweep / f"g{gpus:03d}-{mode}"
    run.mkdir(parents=True)
    config.save(config.replace(cfg, run_dir=str(run)), run)
    write_summary(run, [round(steps_per_s * 10)] * 4, [0.5] * 4)
    c = cfg.cluster
    roles = ["simulator"] * c.sim_ranks + ["generator"] * c.gen_ranks + ["trainer"] * c.train_ranks
    write_metrics(run, [(role, host) for role in roles])
    return run


# The user's case: async below sync at 4 and 8 GPUs, and at 8 GPUs 16 ranks on too few cores.
MEASURED = {(2, "sync"): 30.0, (2, "async"): 33.0, (4, "sync"): 55.0, (4, "async"): 50.0, (8, "sync"): 90.0, (8, "async"): 76.0}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """2/4/8 GPUs x sync/async, every rank on host node-a, which hosts.json says has 8 cores:
    4 and 8 ranks fit, the 8-GPU points' 16 do not."""
    sweep = tmp_path_factory.mktemp("scale") / "sweep"
    for (gpus, mode), v in MEASURED.items():
        scale_point(sweep, gpus, mode, v, "node-a")
    (sweep / "hosts.json").write_text(json.dumps({"node-a": 8}))
    return sweep


def tick_texts(axis) -> list[str]:
    axis.figure.canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def lines_by_gid(ax) -> dict[str, object]:
    return {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}


def test_plain_tick_values():
    from analysis.figures import log_ticks, plain

    assert [plain(v) for v in (2.0, 16, 256, 1e6, 0.25, 1500.0)] == ["2", "16", "256", "1,000,000", "0.25", "1500"]
    assert len(log_ticks(33 / 1.3, 41 * 1.3)) >= 2   # a narrow throughput range still gets labels
    assert log_ticks(10, 1000) == [10, 20, 50, 100, 200, 500, 1000]


def test_scaling_csv_flags_oversubscribed_points_and_the_plot_draws_them_hollow(sweep):
    import matplotlib.pyplot as plt

    from analysis import scaling

    assert scaling.main([str(sweep)]) == 0
    got = {(int(r["gpus"]), r["mode"]): r for r in rows(sweep / "scaling.csv")}
    assert set(got) == set(MEASURED)
    assert set(rows(sweep / "scaling.csv")[0]) >= {"ranks", "env_procs", "hosts", "cores", "oversubscribed",
                                                   "ideal_steps_per_s", "predicted_steps_per_s"}
    for (gpus, mode), r in got.items():
        assert int(r["ranks"]) == 2 * gpus and r["env_procs"] == "0" and r["hosts"] == "1" and r["cores"] == "8"
        assert r["oversubscribed"] == ("true" if gpus == 8 else "false")
        assert float(r["ideal_steps_per_s"]) == pytest.approx(MEASURED[(2, mode)] * gpus / 2)
        assert r["predicted_steps_per_s"] == ""   # no --profile: no prediction
    assert float(got[(8, "async")]["speedup_vs_sync"]) == pytest.approx(76 / 90)

    fig = scaling.figure(scaling.read_csv(sweep / "scaling.csv"), "t")
    ax, bx = fig.axes
    for axis in (ax.xaxis, bx.xaxis):
        assert tick_texts(axis) == ["2", "4", "8"]   # the measured counts, not 2x10^0
    for axis in (ax.yaxis, bx.yaxis):
        assert tick_texts(axis) and all(PLAIN.match(t) for t in tick_texts(axis)), tick_texts(axis)
    lines = lines_by_gid(ax)
    for mode in ("sync", "async"):
        ideal = lines[f"{mode} ideal"]
        assert list(ideal.get_xdata()) == [2, 4, 8]
        assert list(ideal.get_ydata()) == pytest.approx([MEASURED[(2, mode)] * g / 2 for g in (2, 4, 8)])
        hollow, filled = lines[f"{mode} measured hollow"], lines[f"{mode} measured filled"]
        assert list(hollow.get_xdata()) == [8] and hollow.get_markerfacecolor() == "white"
        assert list(filled.get_xdata()) == [2, 4] and filled.get_markerfacecolor() != "white"
    assert list(lines_by_gid(bx)["async / sync measured hollow"].get_xdata()) == [8]
    assert "no planner prediction" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    note = " ".join(t.get_text() for t in fig.texts)
    assert "16 ranks on 8 cores" in note and "oversubscribed" in note
    plt.close(fig)
    assert (sweep / "scaling.png").stat().st_size > 20_000


def test_scaling_draws_the_planners_prediction_of_each_point(sweep, tmp_path):
    from analysis import scaling
    from rlvla3.cluster.compose import CONF_DIR

    profile = scaling.load_profile(CONF_DIR / "profile/emulated_validation.yaml")
    points = scaling.collect(sweep, profile)
    pred = {(r["gpus"], r["mode"]): r["predicted_steps_per_s"] for r in points}
    assert all(v > 0 for v in pred.values()), pred
    # The emulated profile: async keeps its Generators busy, lockstep sync waits on the slowest env.
    assert all(pred[(g, "async")] > pred[(g, "sync")] for g in (2, 4, 8))
    fig = scaling.figure(points, "t", profile_name=profile.name)
    lines = lines_by_gid(fig.axes[0])
    assert list(lines["async planner"].get_ydata()) == pytest.approx([pred[(g, "async")] for g in (2, 4, 8)])
    assert "speedup planner" in lines_by_gid(fig.axes[1])


def test_scaling_redraws_an_older_csv_with_the_unknown_facts_unknown(tmp_path):
    from analysis import scaling

    old = tmp_path / "scaling.csv"
    old.write_text("gpus,mode,steps_per_s,speedup_vs_sync,efficiency,run\n"
                   + "".join(f"{g},{m},{v},1.0,1.0,g{g:03d}-{m}\n" for (g, m), v in MEASURED.items()))
    points = scaling.read_csv(old)
    assert all(r["oversubscribed"] is None and r["cores"] is None and math.isnan(r["predicted_steps_per_s"]) for r in points)
    assert {(r["gpus"], r["mode"]): r["ideal_steps_per_s"] for r in points}[(8, "sync")] == pytest.approx(120.0)
    fig = scaling.figure(points, "t", no_prediction="none in this CSV")
    assert not any(gid.endswith("hollow") for gid in lines_by_gid(fig.axes[0]))
    assert "not checked" in " ".join(t.get_text() for t in fig.texts)
    assert scaling.main([str(old)]) == 0 and old.with_suffix(".png").exists()


def test_scaling_counts_the_cores_of_the_host_it_runs_on(tmp_path):
    """Drawn on a host that ran the ranks (as slurm/scale_test.sh draws): its cores are counted and
    kept in hosts.json for a later redraw elsewhere."""
    from analysis import scaling

    sweep = tmp_path / "sweep"
    scale_point(sweep, 2, "sync", 30.0, socket.gethostname())
    (point,) = scaling.collect(sweep)
    cores = os.cpu_count()
    assert json.loads((sweep / "hosts.json").read_text()) == {socket.gethostname(): cores}
    assert point["ranks"] == 4 and point["cores"] == cores and point["oversubscribed"] == (4 > cores)


@pytest.fixture
def small_run(tmp_path) -> Path:
    """A toy async run folder as the engine leaves it, with no shards: 2 000 000 env steps over
    4 versions (the x axis matplotlib would label `1e6`), 3 ranks' spans, 2 batch sizes."""
    from rlvla3 import config
    from rlvla3.cluster.compose import compose

    run = tmp_path / "2025-01-01" / "12-00-00"
    run.mkdir(parents=True)
    config.save(config.replace(compose([*TOY, "mode=async"]), run_dir=str(run)), run)
    write_summary(run, [500_000] * 4, [0.2, 0.4, 0.6, 0.75])
    spans = {0: [{"n": "sim_step", "t": 100.0 + i, "d": 0.5} for i in range(4)],
             1: [{"n": "infer", "t": 100.2 + i, "d": 0.1, "batch": 4 + 4 * (i % 2)} for i in range(4)],
             2: [{"n": "train", "t": 101.0, "d": 2.0}]}
    write_metrics(run, [("simulator", "h"), ("generator", "h"), ("trainer", "h")], spans)
    return run


def test_timeline_plots_say_which_run_and_draw_wilson_intervals(small_run):
    import matplotlib.pyplot as plt

    from analysis import timeline

    timeline.main([str(small_run)])
    for name in ("timeline", "batches", "staleness", "learning"):
        assert (small_run / f"{name}.png").stat().st_size > 5_000
    learning = rows(small_run / "learning.csv")
    assert [int(r["env_steps_total"]) for r in learning] == [500_000, 1_000_000, 1_500_000, 2_000_000]
    for r in learning:
        assert 0 <= float(r["success_lo"]) < float(r["success"]) < float(r["success_hi"]) <= 1
    fig = timeline.learning_figure(timeline.learning_rows(timeline.read_history(small_run)),
                                   timeline.run_title(small_run, timeline.run_config(small_run)))
    (ax,) = fig.axes
    assert all(PLAIN.match(t) for t in tick_texts(ax.xaxis)) and ax.xaxis.get_offset_text().get_text() == ""
    assert ax.collections, "no interval band drawn"
    title = ax.get_title()
    assert "2025-01-01/12-00-00" in title and "mode async" in title and ("commit" in title)
    assert ax.get_xlabel() == "env steps (cumulative)" and ax.get_ylim() == (0, 1)
    plt.close(fig)


def test_curves_plot_has_plain_env_step_ticks_and_names_its_runs(small_run, tmp_path):
    import matplotlib.pyplot as plt

    from analysis import curves

    runs = [curves.first_versions(curves.load_run(small_run), 4)]
    fig = curves.draw(curves.compare(runs, None, 4), tmp_path / "curves.png", curves.title_of(runs, 4))
    assert (tmp_path / "curves.png").stat().st_size > 20_000
    for ax in (fig.axes[0], fig.axes[2]):   # env steps up to 2 000 000
        assert all(PLAIN.match(t) for t in tick_texts(ax.xaxis)) and ax.xaxis.get_offset_text().get_text() == ""
    assert "2025-01-01/12-00-00 · modes async · first 4 versions" in fig.get_suptitle()
    plt.close(fig)
