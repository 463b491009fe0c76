"""Slurm heterogeneous jobs through submitit: one job, one MPI world.

Component 0 holds the Simulators (CPU nodes), component 1 the Generators and Trainers (one GPU
per rank). A single `srun --het-group=0,1 --mpi=<plugin>` starts every rank, so MPI ranks follow
SLURM_PROCID, component by component: Simulators first, exactly the order `world.derive` gives.

submitit has no het-job support, so `HetSlurmExecutor` extends its SlurmExecutor:
- the batch text has one `#SBATCH hetjob` block per component;
- the srun line adds `--het-group`, `--kill-on-bad-exit=1` (one failing rank ends the world) and
  log paths built from the leader's job id (srun's %j is each component's own id);
- sacct reports a het job as rows `<id>+0`, `<id>+1`: `HetInfoWatcher` folds them into `<id>` so a
  failed component fails the job instead of leaving its state unknown forever.

Each rank runs `python -m rlvla3.cluster.slurm <folder>`: it makes every task report under the leader's
job id, turns an uncaught exception into MPI_Abort, then hands over to submitit, which unpickles
and calls `RankTask` (the engine) and pickles its result.

Preemption: Slurm sends USR2 `cluster.signal_delay_s` before the time limit (or on
`scancel --signal=USR2`). Every rank only sets a flag. The leading Trainer checkpoints after its
current optimizer step and acknowledges to rank 0; rank 0 (a Simulator: submitit requeues from
global rank 0) waits for that acknowledgement, bounded, then lets submitit requeue the job with
`RankTask(resume=True)`.
"""
from __future__ import annotations

import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import submitit
from submitit.slurm import slurm as _slurm

from .. import config
from ..world import gpu_ranks

SAFE_PATH = re.compile(r"[A-Za-z0-9_./+=-]+")
FAILED_STATES = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")


@dataclass(frozen=True)
class Component:
    role: str          # what runs there, for the reader of the batch file
    partition: str
    nodes: int
    ntasks: int
    cpus_per_task: int
    gpus_per_task: int


def components(cfg: config.RunConfig) -> list[Component]:
    """The two het-job components of a run (validated config)."""
    c = cfg.cluster
    sims, gpus = c.sim_ranks, gpu_ranks(cfg)
    sims_per_node = c.cores_per_cpu_node // c.cpus_per_sim_rank
    return [
        Component("simulators", c.cpu_partition, math.ceil(sims / sims_per_node), sims, c.cpus_per_sim_rank, 0),
        Component("generators+trainers", c.gpu_partition, math.ceil(gpus / c.gpus_per_node), gpus,
                  c.cpus_per_gpu_rank, 1),
    ]


def component_directives(cfg: config.RunConfig) -> list[str]:
    """The `#SBATCH` blocks of the two het-job components (also the scale test's allocation)."""
    c = cfg.cluster
    common = [f"--time={c.time}"] + [f"--{k}={v}" for k, v in (("account", c.account), ("qos", c.qos)) if v]
    lines = []
    for i, comp in enumerate(components(cfg)):
        if i:
            lines.append("#SBATCH hetjob")
        lines.append(f"# component {i}: {comp.role}")
        lines += [f"#SBATCH {o}" for o in common]
        lines += [f"#SBATCH --partition={comp.partition}", f"#SBATCH --nodes={comp.nodes}",
                  f"#SBATCH --ntasks={comp.ntasks}", f"#SBATCH --cpus-per-task={comp.cpus_per_task}"]
        if comp.gpus_per_task:
            lines.append(f"#SBATCH --gpus-per-task={comp.gpus_per_task}")
    return lines


def sbatch_text(cfg: config.RunConfig, folder: Path, command: str, job_name: str) -> str:
    """The whole batch file. Every value that reaches it is validated (checks.slurm,
    SAFE_PATH here); `command` is built by the caller from shell-quoted parts."""
    c = cfg.cluster
    # #SBATCH lines are not parsed by a shell: a folder needing quotes is refused, not quoted.
    if SAFE_PATH.fullmatch(str(folder)) is None:
        raise config.ConfigError(f"run_dir={str(folder.parent)!r}: Slurm batch directives cannot carry this path "
                                 "safely; use letters, digits and _ . / + - = only")
    logs = str(folder) + "/"
    lines = ["#!/bin/bash",
             f"# rlvla3 heterogeneous job: {cfg.cluster.sim_ranks} Simulator ranks on CPU nodes, "
             f"{gpu_ranks(cfg)} Generator/Trainer ranks on GPU nodes, one MPI world.",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --output={logs}%j_batch.out",
             f"#SBATCH --error={logs}%j_batch.err",
             "#SBATCH --open-mode=append",
             f"#SBATCH --signal=USR2@{c.signal_delay_s}",
             "#SBATCH --requeue",
             *component_directives(cfg)]
    if c.setup:
        lines += ["", "# site setup (cluster.setup)", *c.setup]
    # srun's %j is each component's own id: logs use the leader's id (SLURM_JOB_ID here).
    lines += ["", "export SUBMITIT_EXECUTOR=slurm",
              'export RLVLA3_JOB_ID="${SLURM_JOB_ID}"',
              "export OMPI_MCA_mpi_yield_when_idle=1",
              f"srun --unbuffered --mpi={c.mpi} --kill-on-bad-exit=1 --het-group=0,1 "
              f'--output {logs}"${{SLURM_JOB_ID}}"_%t_log.out --error {logs}"${{SLURM_JOB_ID}}"_%t_log.err '
              f"{command}", ""]
    return "\n".join(lines)


def time_minutes(t: str) -> int:
    """Slurm time string (validated) -> whole minutes."""
    days, _, rest = t.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        h, m, sec = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        h, m, sec = 0, parts[0], 0
    else:
        h, m, sec = ([0] * (3 - len(parts)) + parts)
    return int(days or 0) * 1440 + h * 60 + m + math.ceil(sec / 60)


# ---------------------------------------------------------------- submitit extension


class HetInfoWatcher(_slurm.SlurmInfoWatcher):
    SACCT_TIMEOUT_S = 20.0
    """submitit runs sacct with no timeout, and sacct waits as long as the accounting daemon does
    (seen: its database gone, `wait` blocked far past its own timeout). A sacct that does not answer
    in time is killed: submitit logs the error and keeps the last state it knew, and `wait` still
    sees the job end through squeue, which asks slurmctld directly."""

    def _make_command(self):
        command = super()._make_command()
        return None if command is None else ["timeout", "--kill-after=5", f"{self.SACCT_TIMEOUT_S:g}", *command]

    def read_info(self, string):
        """sacct rows `<id>+k` (one per component) fold into `<id>`: failed if any component
        failed, running while any runs, else the leader's state."""
        info = super().read_info(string)
        parts: dict[str, list[dict]] = {}
        for jid, stats in info.items():
            if "+" in jid:
                parts.setdefault(jid.split("+")[0], []).append(stats)
        for jid, rows in parts.items():
            states = [r.get("State", "").split(" ")[0] for r in rows]
            bad = [s for s in states if s in FAILED_STATES]
            state = bad[0] if bad else ("RUNNING" if "RUNNING" in states else states[0])
            info[jid] = {**rows[0], "JobID": jid, "State": state}
        return info


class HetSlurmJob(_slurm.SlurmJob):
    watcher = HetInfoWatcher(delay_s=10)


class HetSlurmExecutor(_slurm.SlurmExecutor):
    """submitit's SlurmExecutor, submitting one heterogeneous job per call (never arrays)."""

    job_class = HetSlurmJob

    def __init__(self, folder, cfg: config.RunConfig, job_name: str):
        super().__init__(folder, max_num_timeout=cfg.cluster.max_requeues)
        self.cfg, self.job_name = cfg, job_name
        # submitit tells "timed out" from "preempted" by this (the real limit is in the het blocks).
        self.update_parameters(time=time_minutes(cfg.cluster.time))
        HetSlurmJob.watcher._delay_s = cfg.cluster.poll_s

    @property
    def _submitit_command_str(self) -> str:
        return " ".join([self.python, "-u -m rlvla3.cluster.slurm", shlex.quote(str(self.folder))])

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return sbatch_text(self.cfg, Path(self.folder), command, self.job_name)

    def _num_tasks(self) -> int:
        return sum(c.ntasks for c in components(self.cfg))

    def _internal_process_submissions(self, delayed_submissions):
        if len(delayed_submissions) != 1:
            raise ValueError("Slurm het jobs cannot be job arrays: submit one job per run")
        return super()._internal_process_submissions(delayed_submissions)


# ---------------------------------------------------------------- what runs on every rank


class RankTask:
    """The submitted callable: run this rank's roles of the run in `run_dir`."""

    def __init__(self, run_dir: str, resume: bool = False):
        self.run_dir, self.resume = run_dir, resume

    def __call__(self):
        import signal

        from ..engine import run

        prev = signal.getsignal(signal.SIGUSR2)  # submitit's checkpoint-and-requeue handler
        preempt = run.Preemption(requeue=requeue_by(prev))
        signal.signal(signal.SIGUSR2, preempt.handler)
        check_rank_layout(config.load(self.run_dir))
        return run.main(self.run_dir, resume=self.resume, preemption=preempt)

    def checkpoint(self, *args, **kwargs):
        """Called by submitit on rank 0 after the Trainer's checkpoint: resubmit as a resume."""
        return submitit.helpers.DelayedSubmission(RankTask(self.run_dir, resume=True))


def requeue_by(handler):
    """Rank 0's requeue: submitit's USR2 `handler` (checkpoint the task, `scontrol requeue`, exit).
    Slurm terminates every process of a job it requeues, that scontrol too, and on a loaded node
    the SIGTERM can come before scontrol has exited: submitit then raised, the task reported a
    failure and the waiter cancelled the requeued job (seen once in the preemption test). A
    requeue killed by SIGTERM was accepted (the signal is its effect), so exit as submitit does."""
    import signal
    import subprocess

    def requeue() -> None:
        try:
            handler(signal.SIGUSR2, None)
        except subprocess.CalledProcessError as e:
            if e.returncode != -signal.SIGTERM or list(e.cmd[:2]) != ["scontrol", "requeue"]:
                raise
            print("[rank 0] scontrol requeue was terminated by the requeue it asked for; exiting for it",
                  file=sys.stderr, flush=True)
            sys.exit(-1)

    return requeue


def check_rank_layout(cfg: config.RunConfig) -> None:
    """A rank's role comes from its global rank; check Slurm put it in the matching component."""
    procid = int(os.environ["SLURM_PROCID"])
    sizes = [int(os.environ.get(f"SLURM_NTASKS_HET_GROUP_{k}", 0)) for k in range(2)]
    want = [c.ntasks for c in components(cfg)]
    if sizes != want:
        raise RuntimeError(f"het-job components have {sizes} tasks, the run config needs {want} "
                           "(cluster.sim_ranks, and Generator+Trainer GPUs)")
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() != procid:
        raise RuntimeError(f"MPI rank {MPI.COMM_WORLD.Get_rank()} != SLURM_PROCID {procid}: roles follow the "
                           f"rank, so the MPI plugin (cluster.mpi) must number ranks like Slurm does")
    component = 0 if procid < sizes[0] else 1
    offset = os.environ.get("SLURM_HET_JOB_OFFSET")  # set only inside a het job
    if offset and int(offset) != component:
        raise RuntimeError(f"SLURM_PROCID={procid} runs in het component {offset}, expected {component}")


def install_abort_hook() -> None:
    """An uncaught exception on any rank aborts the whole MPI world (what `python -m mpi4py`
    does for the local launcher); srun --kill-on-bad-exit then ends the step."""
    default = sys.excepthook

    def hook(*exc):
        default(*exc)
        sys.stderr.flush()
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook


def main() -> None:
    # Every task reports (result pickles, requeue) under the leader's id, not its component's.
    if os.environ.get("RLVLA3_JOB_ID"):
        os.environ["SLURM_JOB_ID"] = os.environ["RLVLA3_JOB_ID"]
    install_abort_hook()
    from submitit.core.submission import process_job

    process_job(sys.argv[1])


# ---------------------------------------------------------------- submitting side


def submit(cfg: config.RunConfig, run_dir: Path, job_name: str = "rlvla3"):
    """Submit the run (whose folder `launch.prepare_run_dir` wrote) as one het job."""
    ex = HetSlurmExecutor(run_dir / "slurm", cfg, job_name)
    return ex.submit(RankTask(str(run_dir), resume=cfg.resume))


def dry_run_text(cfg: config.RunConfig, run_dir: Path, job_name: str = "rlvla3") -> str:
    folder = run_dir / "slurm"
    cmd = " ".join([shlex.quote(sys.executable), "-u -m rlvla3.cluster.slurm", shlex.quote(str(folder))])
    return sbatch_text(cfg, folder, cmd, job_name)


def failed_rank(job) -> tuple[int, str] | None:
    """(rank, traceback) of the first rank whose submitit result says it raised, if any."""
    for rank in range(job.num_tasks):
        path = job.task(rank).paths.result_pickle
        if path.exists():
            try:
                outcome, value = submitit.core.utils.pickle_load(path)
            except Exception:  # being written: look again at the next poll
                continue
            if outcome == "error":
                return rank, str(value)
    return None


# slurmctld states of a job it still holds (squeue); anything else, or no row, means it ended.
QUEUED_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                 "RESIZING", "SUSPENDED", "SIGNALING", "STAGE_OUT")


def queued(job_id: str) -> bool | None:
    """Whether slurmctld still holds the job (asked directly, unlike sacct, which goes through
    the accounting daemon and can lag); None when squeue does not answer."""
    import subprocess

    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return False if "Invalid job id" in out.stderr else None   # purged: long over
    return any(state in QUEUED_STATES for state in out.stdout.split())


# Seconds between wait's sacct looks at the job's step.
STEP_CHECK_S = 5.0
# sacct states of a step that has not ended.
LIVE_STEP_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")


def steps_ended(job_id: str) -> bool | None:
    """Whether sacct says the job runs but its srun step has ended: every task of every step
    that began in this run of the job (not before a requeue) ended, and there was one. The batch
    step, which runs the script, is not counted. None when sacct does not answer."""
    import subprocess

    try:
        out = subprocess.run(["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,Start"], capture_output=True,
                             text=True, timeout=HetInfoWatcher.SACCT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        return None
    # (name, first word of the state: "CANCELLED by 0" -> CANCELLED, start) of each row with a state
    rows = [(name, state.split()[0], start) for name, state, start in
            (line.split("|") for line in out.stdout.splitlines() if line.count("|") == 2) if state.strip()]
    jobs = [(state, start) for name, state, start in rows if "." not in name]
    if not jobs or any(state != "RUNNING" for state, _ in jobs):
        return False
    began = max(start for _, start in jobs)   # ISO times sort as text
    steps = [state for name, state, start in rows
             if re.search(r"\.\d+$", name) and start >= began and start[:1].isdigit()]
    return bool(steps) and not any(state in LIVE_STEP_STATES for state in steps)


def rank_errors(job, lines: int = 12) -> str:
    """srun's own errors, then the end of every rank log of the job that holds a traceback (or,
    if none does, of every non-empty one): what a job that ended without results has to say. Logs are found by name,
    not by rank: srun's %t in a het step is not always the global rank (the local cluster skips
    one number between the components); each is labelled with the rank its .out names."""
    folder = Path(job.paths.folder)
    logs = sorted(folder.glob(f"{job.job_id}_*_log.err"), key=lambda f: int(f.name.split("_")[1]))
    texts = {f: f.read_text(errors="replace") for f in logs}
    chosen = [f for f in logs if "Traceback" in texts[f]] or [f for f in logs if texts[f].strip()]
    parts = []
    for f in chosen:
        text = texts[f]
        tail = text[text.rindex("Traceback"):] if "Traceback" in text else text
        parts.append(f"--- {log_rank(f.with_suffix('.out'))} ({f.name}):\n" + "\n".join(tail.splitlines()[-lines:]))
    batch = folder / f"{job.job_id}_batch.err"
    said = [ln for ln in batch.read_text(errors="replace").splitlines() if "srun: error" in ln] if batch.exists() else []
    if said:   # srun names the first task that died first ("task 1: Killed" for a SIGKILL)
        parts.insert(0, "--- srun:\n" + "\n".join(said[:4]))
    return "\n".join(parts) or f"(no rank wrote to its log in {folder})"


def log_rank(out: Path) -> str:
    """'rank K' from the first line submitit writes to a rank's .out, else 'rank ?'."""
    head = out.read_text(errors="replace")[:500] if out.exists() else ""
    m = re.search(r"global_rank=(\d+)", head)
    return f"rank {m.group(1)}" if m else "rank ?"


def dump_stacks(job, settle_s: float = 2.0) -> None:
    """Ask every rank of a job to print its threads' stacks to its log (the engine registers
    faulthandler on SIGUSR1): what a hung job was doing, before it is cancelled."""
    import subprocess
    import time

    subprocess.run(["scancel", "--signal=USR1", job.job_id], capture_output=True, timeout=30)
    time.sleep(settle_s)


class ProgressEcho:
    """Echo the Trainer's progress lines (`[train] ...`, `[eval] ...`) from the job's rank logs to
    this console as they are written, as a local run shows them: each poll reads what the logs
    gained since the last one (whole lines only)."""

    PREFIXES = ("[train]", "[eval]")

    def __init__(self, job, prefix: str = ""):
        self.folder, self.job_id, self.prefix = Path(job.paths.folder), job.job_id, prefix
        self.read: dict[Path, int] = {}

    def __call__(self) -> None:
        for log in sorted(self.folder.glob(f"{self.job_id}_*_log.out")):
            for line in self._new_lines(log):
                if line.startswith(self.PREFIXES):
                    print(self.prefix + line, flush=True)

    def _new_lines(self, log: Path) -> list[str]:
        with open(log, "rb") as f:
            f.seek(self.read.get(log, 0))
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]
        self.read[log] = self.read.get(log, 0) + len(whole)
        return whole.decode(errors="replace").splitlines()


def wait(job, poll_s: float, timeout: float | None = None, grace: float = 30.0, on_poll=None) -> list:
    """Block until every rank has returned (their results), or raise an error naming the job and
    the failing rank. A failure is seen three ways, whichever comes first: a rank's result says it
    raised; sacct says the job ended (submitit's watcher); squeue says slurmctld no longer holds
    the job (sacct can lag behind it, and a job whose ranks were all killed leaves no result).
    srun of a het step has been seen (local test cluster) to miss its step's end and wait
    forever after every task exited: a job still queued `grace` s after all its ranks returned
    is cancelled, with a warning, so it does not hold its nodes until the time limit; one still
    queued `grace` s after sacct says its step ended without every result (srun's
    --kill-on-bad-exit killed the world after a rank died without a word, e.g. SIGKILL) is
    cancelled and raises, naming what srun and the ranks said. `timeout` (seconds, None = as
    long as Slurm keeps the job alive) cancels the job and raises TimeoutError naming it.
    `on_poll`, if given, is called at every poll (ProgressEcho) and once more at the end."""
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    was_gone = False
    ended_since, next_step_check = None, 0.0
    while not job.done():
        now = time.monotonic()
        if deadline is not None and now > deadline:
            dump_stacks(job)
            job.cancel(check=False)
            raise TimeoutError(f"Slurm job {job.job_id} did not finish within {timeout:.0f}s; cancelled it. Where "
                               f"each rank's threads were is at the end of its log, {job.paths.folder}/*_log.err")
        failed = failed_rank(job)
        if failed is not None:
            # One rank's failure loses the MPI world; the job can still look RUNNING (the srun
            # hang above, its other tasks killed without results): cancel it, report the rank.
            job.cancel(check=False)
            raise submitit.core.utils.FailedJobError(
                f"Slurm job {job.job_id}: rank {failed[0]} failed; cancelled the job. Its traceback:\n{failed[1]}")
        gone = queued(job.job_id) is False
        if gone and was_gone:   # twice in a row: slurmctld answers for its own queue
            break
        was_gone = gone
        if now >= next_step_check:   # sacct goes through the accounting daemon: not every poll
            next_step_check = now + STEP_CHECK_S
            ended_since = (ended_since or now) if steps_ended(job.job_id) and not gone else None
            if ended_since is not None and now - ended_since >= grace:
                job.cancel(check=False)
                raise submitit.core.utils.FailedJobError(
                    f"Slurm job {job.job_id}: its step ended {grace:.0f}s ago without every rank's result, but the job "
                    f"still runs (srun missed the end); cancelled it. The ranks' logs:\n{rank_errors(job)}")
        if on_poll is not None:
            on_poll()
        time.sleep(min(poll_s, 2.0))
    if on_poll is not None:
        on_poll()
    try:
        results = job.results()
    except submitit.core.utils.UncompletedJobError as e:
        failed = failed_rank(job)
        why = f"rank {failed[0]} failed. Its traceback:\n{failed[1]}" if failed else \
            f"it ended without every rank's result ({str(e).splitlines()[0]}). The ranks' logs:\n{rank_errors(job)}"
        raise submitit.core.utils.FailedJobError(f"Slurm job {job.job_id}: {why}") from None
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if queued(job.job_id) is False:
            return results
        time.sleep(1.0)
    print(f"warning: job {job.job_id}: every rank returned {grace:.0f}s ago but the job is still queued; "
          "cancelling it", file=sys.stderr, flush=True)
    job.cancel(check=False)
    return results


if __name__ == "__main__":
    main()
