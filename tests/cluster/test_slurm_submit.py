"""The Slurm submission, checked without a cluster: batch text (golden file), validation before
any sbatch, sacct het rows folded into one state, every cluster file composes to a dry run."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlvla3 import config
from rlvla3.cluster import slurm
from rlvla3.cluster.compose import CONF_DIR, compose
from rlvla3.world import derive

GOLDEN = Path(__file__).parent / "golden"
CLUSTERS = sorted(p.stem for p in (CONF_DIR / "cluster").glob("slurm_*.yaml"))
SITE = ["cluster.account=rl-team", "cluster.qos=high", "cluster.mpi=pmix",
        "cluster.setup=[module load openmpi/4.1,source /opt/venvs/rlvla3/bin/activate]"]


def batch_text(overrides, run_dir="/shared/runs/sweep-1/0"):
    cfg = compose(overrides)
    derive(cfg)
    folder = Path(run_dir) / "slurm"
    return slurm.sbatch_text(cfg, folder, f"python -u -m rlvla3.cluster.slurm '{folder}'", "rlvla3-0")


def test_het_job_batch_text_matches_golden_file():
    text = batch_text(["cluster=slurm_16", *SITE])
    golden = GOLDEN / "slurm_16.sbatch"
    if os.environ.get("RLVLA3_UPDATE_GOLDEN") == "1":  # after an intended change: rewrite, review the diff
        golden.write_text(text)
    assert text == golden.read_text(), "batch text changed; if intended, rerun with RLVLA3_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_cluster_file_gives_consistent_components(name):
    cfg = compose([f"cluster={name}"])
    d = derive(cfg)
    text = batch_text([f"cluster={name}"])
    blocks = text.split("#SBATCH hetjob")
    assert len(blocks) == 2
    tasks = [int(re.search(r"--ntasks=(\d+)", b).group(1)) for b in blocks]
    nodes = [int(re.search(r"--nodes=(\d+)", b).group(1)) for b in blocks]
    assert tasks == [cfg.cluster.sim_ranks, d.size - cfg.cluster.sim_ranks]
    assert sum(tasks) == d.size
    c = cfg.cluster
    assert nodes[1] * c.gpus_per_node >= tasks[1] and (nodes[1] - 1) * c.gpus_per_node < tasks[1]
    assert nodes[0] * (c.cores_per_cpu_node // c.cpus_per_sim_rank) >= tasks[0]
    assert "--gpus-per-task=1" in blocks[1] and "gpus" not in blocks[0]
    assert "--het-group=0,1" in text and f"--mpi={c.mpi}" in text and "--kill-on-bad-exit=1" in text


def test_dry_run_of_slurm_256_from_the_command_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "cluster=slurm_256", "cluster.dry_run=true",
                          f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "#SBATCH hetjob" in out.stdout
    assert "--ntasks=256" in out.stdout and "--nodes=32" in out.stdout
    assert not (tmp_path / "slurm").exists()  # nothing prepared, nothing submitted


@pytest.mark.parametrize("override, field", [
    ("cluster.gpu_partition='gpu;reboot'", "cluster.gpu_partition"),
    ("cluster.cpu_partition=", "cluster.cpu_partition"),
    ("cluster.account='$(id)'", "cluster.account"),
    ("cluster.time=2h", "cluster.time"),
    ("cluster.gen_ranks=6", "cluster.gen_ranks"),           # 6 + 4 GPUs: neither fits one 8-GPU node nor fills nodes
    ("cluster.cpus_per_sim_rank=200", "cluster.cpus_per_sim_rank"),
    ("cluster.cpus_per_gpu_rank=20", "cluster.cpus_per_gpu_rank"),
    ("cluster.mpi=pmix x", "cluster.mpi"),
    ("env.num_envs=4", "sharding.plan"),                    # fewer envs than Simulator ranks
])
def test_bad_site_settings_fail_before_submission_naming_the_field(override, field):
    with pytest.raises(config.ConfigError, match=re.escape(field)):
        derive(compose(["cluster=slurm_8", override]))


@pytest.mark.parametrize("bad", ["/shared/it's", "/shared/$(reboot)", "/shared/a b", "/shared/x\nsrun"])
def test_run_folders_that_batch_directives_cannot_carry_are_refused(bad):
    with pytest.raises(config.ConfigError, match="run_dir"):
        batch_text(["cluster=slurm_8"], run_dir=bad)


def test_sacct_het_rows_fold_into_the_job_state():
    w = slurm.HetInfoWatcher()
    head = "JobID|State|NodeList\n"
    running = w.read_info(head + "41+0|RUNNING|cpu1\n41+1|RUNNING|gpu1\n41+0.0|RUNNING|cpu1\n")
    assert running["41"]["State"] == "RUNNING"
    failed = w.read_info(head + "41+0|COMPLETED|cpu1\n41+1|FAILED|gpu1\n")
    assert failed["41"]["State"] == "FAILED"
    done = w.read_info(head + "41+0|COMPLETED|cpu1\n41+1|COMPLETED|gpu1\n")
    assert done["41"]["State"] == "COMPLETED"
    cancelled = w.read_info(head + "41+0|CANCELLED by 0|cpu1\n41+1|RUNNING|gpu1\n")
    assert cancelled["41"]["State"] == "CANCELLED"


def test_time_limits_in_minutes():
    assert [slurm.time_minutes(t) for t in ("30", "10:30", "01:00:00", "1-00:00", "2-1")] == [30, 11, 60, 1440, 2940]


def test_sweep_dry_run_prints_one_het_job_per_point(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "-m", "cluster=slurm_8", "cluster.dry_run=true",
                          "algo.lr=1e-5,3e-5", f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("#SBATCH hetjob") == 2 and "--array" not in out.stdout
    assert not list(tmp_path.glob("*/slurm"))


def test_a_sweep_over_cluster_sizes_runs_every_point_through_the_project_launcher(tmp_path):
    """Hydra picks the launcher without the sweep's own overrides: `-m cluster=slurm_8,slurm_16`
    went to the basic launcher, whose first point ended the process (the task function's exit),
    so slurm_16 never ran. Every sweep now goes through the project's launcher."""
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "-m", "cluster=slurm_8,slurm_16", "cluster.dry_run=true",
                          f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "sweep point #0 (cluster=slurm_8" in out.stdout and "sweep point #1 (cluster=slurm_16" in out.stdout
    assert out.stdout.count("#SBATCH --ntasks=8\n") == 2 and out.stdout.count("#SBATCH --ntasks=16\n") == 2


def test_a_local_sweep_runs_every_point_and_a_mixed_one_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "-m", "+experiment=toy", "cluster.dry_run=true",
                          "algo.lr=1e-4,3e-4", f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("rlvla3.engine.run") == 2 and f"{tmp_path}/1" in out.stdout
    mixed = subprocess.run([sys.executable, "-m", "rlvla3.launch", "-m", "cluster=local,slurm_8", "cluster.dry_run=true",
                            f"hydra.sweep.dir={tmp_path / 'mixed'}"], capture_output=True, text=True, timeout=120)
    assert mixed.returncode != 0 and "mixes Slurm points with local ones (cluster=local" in mixed.stderr
    assert not [p for p in (tmp_path / "mixed").glob("*") if p.is_dir()]   # no point's folder


def test_one_bad_sweep_point_submits_nothing(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "-m", "cluster=slurm_8", "cluster.time=01:00:00,2h",
                          f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "sweep point #1" in out.stderr and "cluster.time='2h'" in out.stderr
    assert not list(tmp_path.glob("*/slurm")) and not list(tmp_path.glob("*/config.yaml"))


def test_the_checkout_paths_the_package_resolves_exist():
    """conf/ and slurm/scale_test.sh are found from the package's own location (a moved module
    once pointed one folder too high)."""
    from rlvla3.cluster import compose, scale

    assert (compose.CONF_DIR / "config.yaml").is_file() and scale.SCRIPT.is_file()
    assert (compose.CONF_DIR / "profile" / "emulated_validation.yaml").is_file()


def test_scale_header_carries_overrides_as_data_never_as_shell(tmp_path):
    """`python -m rlvla3.scale header` pasted the overrides into a double-quoted shell default, and
    the script expanded them unquoted: `$(...)` or backticks in a value ran at sbatch time."""
    import shlex
    import stat

    from rlvla3.cluster import scale

    pwned = tmp_path / "pwned"
    value = f"pick the $(touch {pwned}) `touch {pwned}` \"red\" cube; touch {pwned}"
    overrides = ["cluster=slurm_local", "+experiment=toy", f"env.instruction='{value}'"]
    script = tmp_path / "scale_test.sh"
    script.write_text(scale.SCRIPT.read_text())
    scale.write_header(scale.header(overrides, 32, 4), script)
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" >> {tmp_path / 'args'}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(["bash", str(script)], env={**os.environ, "RLVLA3_PYTHON": str(fake), "SLURM_SUBMIT_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not pwned.exists()
    args = (tmp_path / "args").read_text().splitlines()
    line = args[args.index("--overrides") + 1]
    assert shlex.split(line) == overrides
    with pytest.raises(config.ConfigError, match="line break"):
        scale.header(["cluster=slurm_local", "env.instruction='a\ntouch x'"], 32, 4)


def test_a_sacct_that_never_answers_is_killed_and_the_watcher_goes_on(tmp_path, monkeypatch):
    """sacct blocks while the accounting daemon does (its database gone): the watcher's call is
    bounded, submitit keeps the last known state, and an answering sacct is read as before."""
    import time

    fake = tmp_path / "bin"
    fake.mkdir()
    sacct = fake / "sacct"
    sacct.write_text("#!/bin/sh\nsleep 600\n")
    sacct.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    watcher = slurm.HetInfoWatcher(delay_s=0)
    watcher.SACCT_TIMEOUT_S = 1.0
    watcher.register_job("4242")
    t0 = time.monotonic()
    watcher.update()
    assert time.monotonic() - t0 < 15, "the watcher waited on a sacct that never answers"
    assert watcher.get_state("4242", mode="cache") == "UNKNOWN"
    sacct.write_text("#!/bin/sh\nprintf 'JobID|State|NodeList\\n4242+0|COMPLETED|n1\\n4242+1|FAILED|n2\\n'\n")
    watcher.update()
    assert watcher.get_state("4242", mode="cache") == "FAILED", "a het job's failed component fails it"


def test_a_requeue_whose_scontrol_is_terminated_by_it_exits_as_requeued(tmp_path, monkeypatch):
    """Slurm terminates every process of a job it requeues, `scontrol requeue` itself included;
    dying of that SIGTERM is a requeue done (exit as submitit does), any other failure is raised.
    `scontrol` here is a script that ends as the real one did in the failed run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\n[ "$2" = "term" ] && kill -TERM $$\nexit 1\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def submitit_handler(job_id):   # what submitit's USR2 handler runs on rank 0
        return lambda signum, frame: subprocess.check_call(["scontrol", "requeue", job_id], timeout=10)

    with pytest.raises(SystemExit) as exited:
        slurm.requeue_by(submitit_handler("term"))()
    assert exited.value.code == -1
    with pytest.raises(subprocess.CalledProcessError) as failed:
        slurm.requeue_by(submitit_handler("other"))()
    assert failed.value.returncode == 1
