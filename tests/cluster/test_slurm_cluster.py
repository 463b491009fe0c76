"""Real het jobs on the local Slurm cluster (bash slurm/local/start.sh): one MPI world over a CPU
and a GPU component, Hydra sweeps, preemption + requeue + resume, and failures that surface."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import submitit

from rlvla3.cluster import slurm
from rlvla3.cluster.compose import compose, prepare_run_dir
from rlvla3.cluster.launch import run_slurm
from rlvla3.engine.checkpoints import all_ckpts
from tests.conftest import check_every_shard_consumed_once, summary


def cluster_state() -> str | None:
    """None when the local cluster answers with both partitions, else why not."""
    if shutil.which("sinfo") is None:
        return "Slurm client not installed: run bash slurm/local/start.sh"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "slurmctld does not answer: run bash slurm/local/start.sh"
    parts = set(out.stdout.split())
    return None if {"cpu", "gpu"} <= parts else f"no cpu/gpu partitions ({out.stderr.strip() or parts}): run bash slurm/local/start.sh"


pytestmark = [pytest.mark.slurm, pytest.mark.skipif(cluster_state() is not None, reason=str(cluster_state()))]

TOY_SLURM = ["cluster=slurm_local", "+experiment=toy", "runtime.tensorboard=false", "runtime.liveness_timeout=20"]


def rank_hosts(run: Path) -> dict[int, tuple[str, str]]:
    out = {}
    for f in sorted((run / "metrics").glob("rank*.jsonl")):
        meta = json.loads(f.open().readline())
        out[meta["rank"]] = (meta["role"], meta["host"])
    return out


def test_hydra_sweep_runs_one_het_job_per_point(tmp_path):
    sweep = tmp_path / "sweep"
    # One epoch per version (not toy's 4): the plumbing is under test here, not the learning.
    proc = subprocess.run([sys.executable, "-m", "rlvla3.launch", "-m", *TOY_SLURM, "algo.max_versions=3",
                           "algo.update_epochs=1", "mode=sync,async", f"hydra.sweep.dir={sweep}"],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for point, mode in (("0", "sync"), ("1", "async")):
        run = sweep / point
        s = summary(run)
        assert s["versions"] == 3 and s["rows_trained"] == 3 * 256
        assert (run / "config.yaml").read_text().count(f"name: {mode}") == 1
        hosts = rank_hosts(run)
        assert len(hosts) == 6  # one MPI world: 2 Simulators + 2 Generators + 2 Trainers
        # Simulators ran in the CPU component, Generators/Trainers in the GPU component.
        assert all(h.startswith("cpu") for r, (role, h) in hosts.items() if role == "simulator"), hosts
        assert all(h.startswith("gpu") for r, (role, h) in hosts.items() if role != "simulator"), hosts
        assert len(list((run / "slurm").glob("*_result.pkl"))) == 6  # every rank's result collected
    job_ids = {f.name.split("_")[0] for p in ("0", "1") for f in (sweep / p / "slurm").glob("*_submitted.pkl")}
    assert len(job_ids) == 2 and all(j.isdigit() for j in job_ids)  # two plain jobs, not an array
    # The Trainers' lines while the jobs ran, one result line per point, and the sweep's table.
    assert "#0 [train] version    3/3" in proc.stdout and "#1 [train] version    3/3" in proc.stdout, proc.stdout[-3000:]
    for point, mode in (("0", "sync"), ("1", "async")):
        assert re.search(rf"^#{point} .* mode={mode}: ok, 3 versions, ", proc.stdout, re.M), proc.stdout[-3000:]
    table = (sweep / "sweep.md").read_text().splitlines()
    assert len(table) == 4 and table[0].startswith("| point | overrides | status | versions") and "| ok | 3 |" in table[2]


def wait_for(pred, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise TimeoutError(f"{what} not within {timeout:.0f}s")


def start_now(job_id: str) -> bool:
    """A requeued job waits ~2 minutes before it may start again: release it and start it now.
    True once it runs. (Said once while the requeue is still being processed, the requeue's own
    begin time can come after it and win: the test waited the 2 minutes. So it is said again.)"""
    if squeue_state(job_id) in ("RUNNING", "COMPLETING", ""):
        return True
    subprocess.run(["scontrol", "release", job_id], capture_output=True, timeout=10)
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], capture_output=True, timeout=10)
    return False


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=10)
    return out.stdout.split()[0] if out.stdout.split() else ""


def test_preempted_job_checkpoints_requeues_and_resumes_exactly(tmp_path):
    """With its envs in child processes, as every rendering env runs: Slurm's USR2
    reaches every process of the step, and it killed the env children (default action), the
    Simulator then crashed on a dead pipe before the Trainer's checkpoint, and the job FAILED.
    The model is sharded over the two Trainer ranks (FSDP): the preemption's checkpoint is a
    folder each of them writes its shards of."""
    versions = 6   # 3 before the signal, 3 after the requeue
    cfg = compose([*TOY_SLURM, f"algo.max_versions={versions}", "algo.micro_batch=16", "mode=async",
                   "env.in_process=false", "env.num_envs=4", "policy.data_parallel=fsdp"])
    run = tmp_path / "run"
    cfg, _ = prepare_run_dir(cfg, run)
    job = slurm.submit(cfg, run)
    # Let it train a few versions, then send what Slurm sends before a time limit.
    wait_for(lambda: len(all_ckpts(run / "ckpt")) >= 3, 180, "version 3 checkpoint")
    subprocess.run(["scancel", "--signal=USR2", job.job_id], check=True, timeout=10)
    wait_for(lambda: squeue_state(job.job_id) in ("PENDING", "REQUEUED", "REQUEUE_HOLD"), 120, "requeue")
    wait_for(lambda: start_now(job.job_id), 120, "the requeued job's start", poll=2)
    slurm.wait(job, cfg.cluster.poll_s, timeout=300)

    logs = "".join(p.read_text(errors="replace") for p in (run / "slurm").glob("*_log.*"))
    assert re.search(r"preemption signal: checkpoint v\d+(-s\d+)?\.dcp", logs) and "preempted: Trainer checkpoint" in logs
    assert "resumed from" in logs
    assert "restarting it" not in logs, "an env child died of the preemption signal"
    s = summary(run)
    assert s["versions"] == versions
    assert [h["version"] for h in s["history"]] == list(range(1, versions + 1))  # counters continue
    # trained = committed; every committed row of every trained step exactly once
    check_every_shard_consumed_once(run, versions, cfg.algo.rollout_batch)


def test_a_rank_that_raises_fails_the_submission(tmp_path, capsys):
    # policy.device=cuda on GPU ranks that see no CUDA: they raise at start-up.
    cfg = compose([*TOY_SLURM, "algo.max_versions=3", "policy.device=cuda"])
    t0 = time.monotonic()
    rc = run_slurm(cfg, tmp_path / "run")
    print(f"a raising rank: submission reported failure after {time.monotonic() - t0:.1f}s (submit to report)")
    assert rc == 1 and time.monotonic() - t0 < 120
    last = capsys.readouterr().err.strip().splitlines()[-1]   # the rank's own exception, not the MPI banner
    assert last.startswith("first error: rank ") and "this rank sees no CUDA device" in last, last
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run" / "slurm").glob("*_log.err"))
    assert "policy.device=cuda but this rank sees no CUDA device" in logs


def rank_pid(job_id: str, procid: int) -> int | None:
    """PID of global rank `procid` of a job (every rank's environment carries the leader's id)."""
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            vars_ = dict(v.split("=", 1) for v in env.read_bytes().decode(errors="replace").split("\0") if "=" in v)
            cmd = (env.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if (vars_.get("RLVLA3_JOB_ID") == job_id and vars_.get("SLURM_PROCID") == str(procid)
                and b"rlvla3.cluster.slurm" in cmd):
            return int(env.parent.name)
    return None


def rank_logs(run: Path, chars: int = 4000) -> str:
    return "\n".join(f"== {f.name}\n{f.read_text(errors='replace')[-chars:]}" for f in sorted((run / "slurm").glob("*.err")))


def test_a_sigkilled_rank_fails_the_submission(tmp_path):
    cfg = compose([*TOY_SLURM, "algo.max_versions=200", "algo.update_epochs=1"])   # the first checkpoint sooner
    run = tmp_path / "run"
    cfg, _ = prepare_run_dir(cfg, run)
    job = slurm.submit(cfg, run)
    wait_for(lambda: list((run / "ckpt").glob("v*.pt")), 180, "first checkpoint")
    pid = wait_for(lambda: rank_pid(job.job_id, 1), 30, "PID of rank 1")
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(Exception) as err:
        slurm.wait(job, cfg.cluster.poll_s, timeout=120)
    took = time.monotonic() - t0
    print(f"SIGKILL of rank 1: submission reported failure {took:.1f}s after the kill:\n{str(err.value)[:1500]}")
    assert took < 90, f"{err.value}\n{rank_logs(run)}"   # on a timeout the logs hold every rank's stacks
    message = str(err.value)
    assert job.job_id in message and ("task 1: Killed" in message or "rank 1 (simulator)" in message), message


def test_a_job_whose_step_ended_without_results_but_still_runs_is_cancelled_and_named(tmp_path):
    """After --kill-on-bad-exit killed every rank, srun of a het step has been seen here to miss
    the step's end, keeping the job RUNNING with no rank left (a SIGKILLed rank then waited out
    the 120 s timeout). Made on purpose: the script's one step ends, then the script sleeps."""
    out = subprocess.run(["sbatch", "--parsable", "-p", "cpu", "-n1", f"--output={tmp_path}/%j_batch.out",
                          f"--error={tmp_path}/%j_batch.err", "--wrap", "srun -n1 sleep 8; sleep 300"],
                         capture_output=True, text=True, timeout=30, check=True)
    job_id = out.stdout.strip().split(";")[0]
    job = submitit.SlurmJob(tmp_path, job_id)
    try:
        assert not slurm.steps_ended(job_id)   # just submitted: no step yet, or its step still runs
        t0 = time.monotonic()
        with pytest.raises(submitit.core.utils.FailedJobError, match=f"Slurm job {job_id}: its step ended 5s ago"):
            slurm.wait(job, poll_s=1.0, timeout=120, grace=5.0)
        took = time.monotonic() - t0
        assert took < 60, took
        wait_for(lambda: slurm.queued(job_id) is False, 30, "the cancelled job to leave the queue")
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def test_sbatch_scale_test_leaves_a_run_folder_per_point_and_a_plot(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    sweep = tmp_path / "sweep"
    # 8..256 GPUs divided by 128: the one point of 2 GPUs, sync and async (the sweep's plumbing and
    # its plot are under test, not scaling; more points cost CI a minute)
    env = {**os.environ, "RLVLA3_SCALE_DIV": "128", "RLVLA3_SWEEP": str(sweep), "RLVLA3_PYTHON": sys.executable,
           # the script's own points, at one epoch per version: the sweep's plumbing is under test
           "RLVLA3_SCALE_OVERRIDES": "cluster=slurm_local +experiment=toy algo.max_versions=2 algo.update_epochs=1"}
    proc = subprocess.run(["sbatch", "--wait", f"--output={tmp_path}/scale-%j.out", "slurm/scale_test.sh"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    log = "".join(p.read_text() for p in tmp_path.glob("scale-*.out"))
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    points = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert points == ["g002-async", "g002-sync"], points
    for p in points:
        assert summary(sweep / p)["versions"] == 2
    rows = (sweep / "scaling.csv").read_text().splitlines()
    assert rows[0].startswith("gpus,mode,steps_per_s") and len(rows) == 3
    assert (sweep / "scaling.png").stat().st_size > 10_000
