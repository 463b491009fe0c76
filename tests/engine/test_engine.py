"""End-to-end: the real launcher, mpiexec, Simulator/Generator/Trainer ranks, zarr shards."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose, prepare_run_dir
from rlvla3.cluster.local import mpi_env, mpiexec_command
from rlvla3.engine import checkpoints, shards
from rlvla3.engine.metrics import read_summaries
from tests.conftest import SYNC_PARITY, TOY, assert_ok, check_every_shard_consumed_once, final_checkpoint, needs_mpi, run_engine, summary

pytestmark = [needs_mpi, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_end_to_end_both_modes(tmp_path, mode):
    # Two Simulator ranks on one Generator: sync rounds must hold each rank to the others'
    # pace (a round served a fast rank's next request once, and deadlocked at a credit boundary).
    proc, run = run_engine(tmp_path, [*TOY, f"mode={mode}", "cluster.sim_ranks=2", "algo.update_epochs=1"])   # plumbing, not learning
    assert_ok(proc)
    s = summary(run)
    assert s["versions"] == 3 and [h["version"] for h in s["history"]] == [1, 2, 3]
    check_every_shard_consumed_once(run, 3, 256)
    stale = [h["staleness_max"] for h in s["history"]]
    assert max(stale) <= (0 if mode == "sync" else 1)
    # The Trainer's off-policy share is what the shards hold (one epoch: each row trained once).
    assert [h["stale_share"] for h in s["history"]] == pytest.approx(stale_shares_on_disk(run, 3))
    if mode == "sync":
        assert all(h["stale_share"] == 0 and h["mixed_segments"] == 0 for h in s["history"])
    # The stale rows' behaviour weights: none without stale rows; else a mean within (0, clip 2]
    # and an effective sample share within (0, 1].
    for h in s["history"]:
        if h["stale_share"] == 0:
            assert np.isnan(h["stale_weight"]) and np.isnan(h["stale_ess"]), h
        else:
            assert 0 < h["stale_weight"] <= 2.0 and 0 < h["stale_ess"] <= 1.0 + 1e-9, h
    assert "version    3" in proc.stdout
    assert (run / "config.yaml").exists() and list((run / "metrics").glob("rank*.jsonl"))
    # Simulator ranks never import torch; policy ranks do (the emulated test relies on this record).
    for r in read_summaries(run):
        assert ("torch" in r["heavy_modules"]) == (r["role"] != "simulator"), r


def stale_shares_on_disk(run, versions: int) -> list[float]:
    """Per rollout step k: the share of its valid rows that a version older than k produced."""
    stale, valid = np.zeros(versions), np.zeros(versions)
    for n in shards.scan(run / "shards"):
        step = shards.parse_name(n)[0]
        if step < versions:
            a = shards.read_shard(run / "shards" / n)[0]
            ok = a["valid"].astype(bool)
            stale[step] += (ok & (a["versions"] < step)).sum()
            valid[step] += ok.sum()
    return list(stale / valid)


def test_colocated_sync_and_eta0_barrier(tmp_path):
    proc, sync_run = run_engine(tmp_path, [*TOY, "mode=sync", "mode.placement=colocated", "algo.update_epochs=1"], name="colo")
    assert_ok(proc)
    assert summary(sync_run)["versions"] == 3
    # Without streaming (epoch 0 then takes the whole step in name order, as sync does), async with
    # a per-step weight barrier is sync: one code path, so every version's weights are bitwise
    # sync's. With streaming, epoch 0 trains rows in arrival order: the same rows, another order.
    proc, run = run_engine(tmp_path, [*TOY, "mode=async", "mode.eta=0", "mode.streaming=false", "algo.update_epochs=1"],
                           name="eta0")
    assert_ok(proc)
    for n in shards.scan(run / "shards"):
        step = shards.parse_name(n)[0]
        v = shards.read_shard(run / "shards" / n)[0]["versions"]
        assert (v == step).all(), f"eta=0: {n} has versions {np.unique(v)}, expected only {step}"
    assert all(h["stale_share"] == 0 for h in summary(run)["history"])
    for version in (1, 2, 3):
        sync_w, eta0_w = (torch.load(r / "ckpt" / checkpoints.ckpt_name(version), weights_only=False)["model"] for r in (sync_run, run))
        assert all(torch.equal(sync_w[k], eta0_w[k]) for k in sync_w), f"version {version}: eta=0 weights differ from sync's"


def test_lr_warmup_and_decay_reach_the_optimizer(tmp_path):
    from rlvla3.algo import lr_at
    from rlvla3.world import derive

    overrides = [*TOY, "algo.lr_warmup_steps=3", "algo.lr_decay=true"]
    proc, run = run_engine(tmp_path, overrides)
    assert_ok(proc)
    ckpt = final_checkpoint(run)
    cfg = compose(overrides)
    total = cfg.algo.max_versions * derive(cfg).opt_steps_per_version
    assert ckpt["opt_step"] == total
    lr = ckpt["optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(lr_at(cfg.algo.lr, total, 3, total, True)) and lr < cfg.algo.lr / 2


def test_two_trainers_agree_and_match_one(tmp_path, one_trainer_run):
    """Sync mode is deterministic (per-request sampling noise, seeded envs, lockstep), so the
    1- and 2-Trainer runs see the same data; their parameters must match, and the 2 data-parallel
    ranks must hold bit-identical parameters."""
    r1 = one_trainer_run
    p2, r2 = run_engine(tmp_path, [*SYNC_PARITY, "cluster.train_ranks=2"], name="two")
    assert_ok(p2)
    a, b = (run / "params-trainer0.sha256" for run in (r1, r2))
    assert (r2 / "params-trainer0.sha256").read_text() == (r2 / "params-trainer1.sha256").read_text()
    names = shards.scan(r1 / "shards")
    assert names == shards.scan(r2 / "shards")
    for n in names:   # the same data
        x, y = shards.read_shard(r1 / "shards" / n)[0], shards.read_shard(r2 / "shards" / n)[0]
        np.testing.assert_array_equal(x["sample"], y["sample"])
    # Adam turns float-rounding differences of the all-reduce into small parameter differences;
    # they must be tiny next to how far training moved the parameters.
    from rlvla3 import config
    from rlvla3.policies import make_policy
    from rlvla3.world import spec

    cfg = config.load(r1)
    flat = lambda m: torch.cat([m[k].flatten().float() for k in sorted(m)])  # noqa: E731
    p0 = flat(make_policy(cfg, spec(cfg)).state_dict())
    p1, p2 = flat(final_checkpoint(r1)["model"]), flat(final_checkpoint(r2)["model"])
    moved = (p1 - p0).norm()
    assert moved > 0.1
    assert (p1 - p2).norm() / moved < 0.01


def test_killed_simulator_rank_fails_the_job_quickly_naming_it(tmp_path):
    cfg = compose([*TOY, "algo.max_versions=1000", "cluster.sim_ranks=2", "env.num_envs=8",
                   "runtime.liveness_timeout=10"])
    run = tmp_path / "kill"
    cfg, d = prepare_run_dir(cfg, run)
    proc = subprocess.Popen(mpiexec_command(cfg, d.size, run), env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not shards.scan(run / "shards") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert shards.scan(run / "shards"), "the run never produced a shard"
        meta = json.loads((run / "metrics" / "rank0001.jsonl").read_text().splitlines()[0])
        assert meta["role"] == "simulator"
        t_kill = time.monotonic()
        os.kill(meta["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert elapsed < 60
    assert "rank 1" in out, out[-3000:]


def test_resume_trains_every_row_exactly_once(tmp_path):
    p, run = run_engine(tmp_path, [*TOY, "algo.max_versions=2"], name="res")
    assert_ok(p)
    p = subprocess.run(mpiexec_command(*_resume_cfg(run, 4)), env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert_ok(p)
    assert "resumed from v000002.pt" in p.stdout
    check_every_shard_consumed_once(run, 4, 256)


def _resume_cfg(run, versions):
    from rlvla3 import config

    cfg = config.load(run)
    cfg = config.replace(cfg, resume=True, algo={"max_versions": versions})
    cfg, d = prepare_run_dir(cfg, run)
    return cfg, d.size, run


@pytest.mark.sim
def test_an_env_that_cannot_start_fails_the_job_naming_the_task(tmp_path):
    """env.task=NoSuchTask: the job ends non-zero after bounded restarts, the message names the task
    (it used to restart the children forever, and the launcher never returned). The launcher now
    refuses an unknown task before any rank starts (tests/envs/test_envs.py); the run folder is
    written here without that check, as for an env whose package lists a task it cannot build."""
    from rlvla3 import config
    from rlvla3.world import derive

    cfg = compose(["env=robosuite_lift", "env.task=NoSuchTask", "algo.max_versions=1", "runtime.tensorboard=false"])
    run = tmp_path / "run"
    run.mkdir()
    cfg = config.replace(cfg, run_dir=str(run))
    config.save(cfg, run)
    t0 = time.monotonic()
    proc = subprocess.run(mpiexec_command(cfg, derive(cfg).size, run), env=mpi_env(), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode != 0 and time.monotonic() - t0 < 180
    assert "EnvStartError" in proc.stderr and "env.task='NoSuchTask'" in proc.stderr, proc.stderr[-3000:]


def test_a_checkpoint_longer_than_the_liveness_timeout_does_not_abort_the_job(tmp_path, monkeypatch):
    """Heartbeats came only from the main loop, so a Trainer busy writing a large checkpoint for
    longer than runtime.liveness_timeout was declared dead by every peer (here: a 12 s save
    against an 8 s timeout, made slow by a sitecustomize in the ranks)."""
    survives_a_slow_rank(tmp_path, monkeypatch, "import rlvla3.engine.checkpoints as c\n_publish = c.publish\n"
                         "def slow(*a, **k):\n    time.sleep(12)\n    return _publish(*a, **k)\nc.publish = slow\n")


def survives_a_slow_rank(tmp_path, monkeypatch, patch: str) -> None:
    """Run toy for one version with an 8 s liveness timeout while `patch` (a sitecustomize in
    every rank, `time` imported) makes one step of one role take 12 s: the job must finish."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import time\n" + patch)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    t0 = time.monotonic()
    proc, run = run_engine(tmp_path, [*TOY, "algo.max_versions=1", "runtime.liveness_timeout=8",
                                      "runtime.heartbeat_interval=1"])
    assert_ok(proc)
    assert time.monotonic() - t0 > 12 and summary(run)["versions"] == 1


LONG_EMULATED = ["+experiment=emulated", "env.in_process=false", "env.num_envs=2", "algo.max_versions=100000",
                 "runtime.tensorboard=false"]


def processes_marked(mark: str) -> list[int]:
    """Live processes whose environment holds RLVLA3_TEST_MARK=`mark` (zombies have none)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if f"RLVLA3_TEST_MARK={mark}".encode() in env:
            out.append(int(d))
    return out


def test_a_launcher_timeout_leaves_no_process_of_the_job_behind(tmp_path, monkeypatch):
    """run_local's timeout killed mpiexec only: the ranks (each in its own process group) and
    their env children lived on (6 processes here) until they noticed, holding the run folder's
    lock and the cores meanwhile."""
    from rlvla3.cluster.local import run_local

    run = tmp_path / "orphans"
    monkeypatch.setenv("RLVLA3_TEST_MARK", str(run))   # inherited by every process of the job
    with pytest.raises(subprocess.TimeoutExpired):
        run_local(compose(LONG_EMULATED), run, timeout=15, capture=True)
    left = processes_marked(str(run))   # at once: a retry on the same run folder must find it free
    assert not left, f"{len(left)} processes of the job outlived the launcher's timeout"


# A tool that runs a job through run_local (an evaluation, a benchmark), as a user starts it from a
# terminal: Ctrl-C raises KeyboardInterrupt there (set explicitly: a shell starts background
# commands with SIGINT ignored, and pytest may run in one).
LAUNCHER = """
import signal, sys
from pathlib import Path
from rlvla3.cluster.compose import compose
from rlvla3.cluster.local import run_local
signal.signal(signal.SIGINT, signal.default_int_handler)
run_local(compose(sys.argv[2:]), Path(sys.argv[1]), timeout=600, capture=True)
"""


# The exit status says the tool ended by the signal: Python ends on an uncaught KeyboardInterrupt
# by SIGINT itself; SIGTERM is 128 + 15.
@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_stopped_launcher_leaves_no_process_of_the_job_behind(tmp_path, monkeypatch, sig, rc):
    """mpiexec runs in a session of its own, which neither a terminal's Ctrl-C nor the launcher's
    own end reaches: stopping a tool that called run_local left the ranks and their envs running,
    holding the run folder's lock and the cores."""
    run = tmp_path / "stopped"
    monkeypatch.setenv("RLVLA3_TEST_MARK", str(run))
    tool = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run), *LONG_EMULATED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(processes_marked(str(run))) < 4:   # the tool, mpiexec and at least two ranks
        assert tool.poll() is None, f"the job ended before it was stopped: {tool.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "the job's ranks did not start within 120 s"
        time.sleep(0.5)
    tool.send_signal(sig)
    _, err = tool.communicate(timeout=120)
    assert tool.returncode == rc, err[-2000:]
    left = processes_marked(str(run))
    assert not left, f"{len(left)} processes of the job outlived its stopped launcher"


def test_a_generator_slow_to_start_is_not_declared_silent(tmp_path, monkeypatch):
    """Start-up skew: a Generator that takes longer than runtime.liveness_timeout
    to build its model (here 12 s against 8 s, by a sitecustomize in the ranks) must not be
    blamed by the peers that are ready first. It holds the GIL all that time, so its heartbeat
    thread is silent too, as when a large extension module loads on a crowded node (a CI run's
    Hydra sweep, two jobs on two cores, was aborted so: its Simulators were ready first)."""
    survives_a_slow_rank(tmp_path, monkeypatch, "import sys\nimport rlvla3.engine.generator as g\n"
                         "_init = g.Generator.__init__\n"
                         "def slow(self, *a, **k):\n    sys.setswitchinterval(60)\n    end = time.monotonic() + 12\n"
                         "    while time.monotonic() < end:\n        pass\n    sys.setswitchinterval(0.005)\n"
                         "    _init(self, *a, **k)\n"
                         "g.Generator.__init__ = slow\n")
