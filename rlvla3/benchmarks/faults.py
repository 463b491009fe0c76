"""`python -m rlvla3.bench faults [--minutes N] [--seed S] [--out DIR] [overrides...]`

Fault injection against the real engine: mpiexec ranks of the emulated workload with its envs in
child processes. Each attempt (a job; every one after the first resumes the same run folder)
first takes 0-2 faults it must survive (an env child killed, or stopped so that env.step_timeout
fires), then one that ends it: a Simulator, the Generator or the Trainer killed (SIGKILL) or
the Generator stopped (SIGSTOP, silent to its peers), or a rank killing itself at a named fault
point (engine/faults.py: halfway through a shard write, a checkpoint save, a weight publish).
When the time is up, one last resume runs two more versions with no fault, and the run folder
is audited:

- every row of every trained rollout step entered training exactly once (the final
  checkpoint's ledger against the shards on disk): rows lost and rows trained twice must be 0;
- version numbers name one policy: each resume republishes its version with the very weights
  that version had (the fingerprint each publish records), and every rescanned shard made by
  weights the rollback lost is relabelled stale (counted here from disk, before the resume,
  against what the Trainer says it relabelled);
- every fatal fault ends the job (never a hang), the error names the rank, and no process of
  the job outlives it.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .. import config
from ..cluster.compose import compose, prepare_run_dir
from ..cluster.local import kill_session, mpi_env, mpiexec_command, session_procs
from ..engine import checkpoints, faults, shards
from ..engine.learners import EmulatedLearner
from ..engine.metrics import file_records
from ..world import World

WORKLOAD = ["+experiment=emulated", "env.in_process=false", "env.num_envs=4", "cluster.sim_ranks=2",
            "sharding.groups_per_rank=1", "algo.segment_steps=8", "algo.rollout_batch=32", "algo.global_batch=16",
            "algo.micro_batch=16", "env.step_ms=2", "env.reset_ms=5", "policy.infer_fixed_ms=1",
            "policy.train_samples_per_s=2000", "runtime.liveness_timeout=6", "runtime.startup_timeout=120",
            "env.step_timeout=3", "env.reset_timeout=20", "env.start_timeout=20", "runtime.shutdown_timeout=10",
            "runtime.tensorboard=false", "runtime.progress=false", "algo.max_versions=1000000"]
SURVIVABLE = {
    "env_child_kill": "SIGKILL one env child process of a Simulator",
    "env_child_stop": "SIGSTOP one env child (a hung simulator): env.step_timeout kills and restarts it",
}
SIGNALLED = {
    "simulator_kill": ("simulator", signal.SIGKILL),
    "generator_kill": ("generator", signal.SIGKILL),
    "generator_stop": ("generator", signal.SIGSTOP),
    "trainer_kill": ("trainer", signal.SIGKILL),
}
MPI_REPORT = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal")
POINT_ROLE = {"shard_write": "simulator", "ckpt_save": "trainer", "weight_publish": "trainer"}   # who reaches it
FATAL = [*SIGNALLED, *faults.POINTS]
RELABELLED = re.compile(r"(\d+) shard\(s\) of lost weights \(versions > (\d+)\) relabelled stale")   # the Trainer's resume line
EXIT_TIMEOUT = 90.0      # a fatal fault must end the job within this (liveness 6 s + shutdown)
START_TIMEOUT = 120.0    # a job must publish a new shard within this after its start


# ---------------------------------------------------------------- the job's processes
def rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"OMPI_COMM_WORLD_RANK=")), None)


class Job:
    """One mpiexec job of the run folder, in its own session (so every process it started, env
    children included, can be found and swept)."""

    def __init__(self, cfg, world: World, run: Path, log: Path, fault_point: str | None):
        env = mpi_env()
        if fault_point:
            env[faults.ENV_VAR] = fault_point
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(mpiexec_command(cfg, world.size, run), env=env, stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.sid = self.proc.pid

    def ranks(self) -> dict[int, int]:
        """rank -> pid of the job's rank processes (their env children excluded)."""
        out = {}
        for pid, (_, cmd) in session_procs(self.sid).items():
            if b"rlvla3.engine.run" in cmd and (r := rank_of(pid)) is not None:
                out[r] = pid
        return out

    def env_children(self, parent: int) -> list[int]:
        return [pid for pid, (ppid, cmd) in session_procs(self.sid).items() if ppid == parent and b"spawn_main" in cmd]

    def wait(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def sweep(self) -> int:
        """Kill whatever of the job still lives and wait until it is gone (rank 0's run-folder
        lock with it); returns how many processes that was."""
        n = kill_session(self.sid)
        self.proc.wait()
        return n

    def outlived(self, grace: float = 5.0) -> int:
        """After mpiexec exited: how many of the job's processes outlived it (after `grace` s)."""
        wait_for(lambda: not session_procs(self.sid), grace, 0.1)
        return self.sweep()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


# ---------------------------------------------------------------- the run folder
def committed_version(run: Path) -> int:
    ckpts = checkpoints.all_ckpts(run / "ckpt")
    return checkpoints.ckpt_order(ckpts[-1])[0] if ckpts else 0


def wait_for(pred, timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(poll)
    return pred()


def lost_weight_shards(run: Path) -> tuple[int, int]:
    """(version a resume will restart at, published shards of untrained steps made by later
    weights), computed from disk before the resume starts."""
    found = checkpoints.load_newest(EmulatedLearner.load, run / "ckpt", lambda m: None)
    v = int(found[1]["version"]) if found else 0
    n = 0
    for name in shards.scan(run / "shards"):
        if shards.parse_name(name)[0] >= v:
            try:
                n += shards.read_attrs(run / "shards" / name)["max_version"] > v
            except shards.ShardError:
                pass   # the Trainer quarantines it
    return v, n


def publishes_by_attempt(run: Path, rank: int) -> list[list[tuple[int, int]]]:
    """(version, fingerprint) of each weight publish of `rank`, attempt by attempt (a metrics
    file gets a meta line per start; a rank killed mid-line leaves a torn line, skipped)."""
    attempts: list[list[tuple[int, int]]] = []
    for rec in file_records(run / "metrics" / f"rank{rank:04d}.jsonl"):
        if rec["k"] == "meta":
            attempts.append([])
        elif rec["k"] == "span" and rec["n"] == "weight_sync" and "fingerprint" in rec and attempts:
            attempts[-1].append((rec["version"], rec["fingerprint"]))
    return attempts


def republish_check(attempts: list[list[tuple[int, int]]]) -> Counter:
    """Each resumed attempt's first publish against the last publish of that version before it."""
    out = Counter()
    for i, pubs in enumerate(attempts[1:], 1):
        if not pubs:
            continue
        v, fp = pubs[0]
        before = [f for a in attempts[:i] for (u, f) in a if u == v]
        out["unverifiable" if not before else "same" if before[-1] == fp else "other"] += 1
    return out


def audit_rows(run: Path, rollout_batch: int) -> dict:
    """The final checkpoint's ledger against the shards of every trained step."""
    path, state = checkpoints.load_newest(EmulatedLearner.load, run / "ckpt", lambda m: None)
    v, ledger = int(state["version"]), state["ledger"]["rows"]
    lost = twice = rows = 0
    for name in shards.scan(run / "shards"):
        if shards.parse_name(name)[0] < v:
            n = shards.read_attrs(run / "shards" / name)["rows"]
            rows += n
            lost += max(0, n - ledger.get(name, 0))
            twice += max(0, ledger.get(name, 0) - n)
    bad = run / "shards" / shards.BAD_DIR
    quarantined = sorted(e.name for e in os.scandir(bad)) if bad.is_dir() else []
    return {"checkpoint": path.name, "versions": v, "rows": rows, "lost": lost, "twice": twice,
            "rows_trained": int(state["rows_trained"]), "expected": v * rollout_batch,
            "ledger_total": sum(ledger.values()), "quarantined": quarantined}


# ---------------------------------------------------------------- faults
@dataclass
class Outcome:
    kind: str
    attempt: int
    fatal: bool
    rank: int | None = None
    role: str = ""
    ok: bool = False              # survived (survivable) / ended the job naming the rank (fatal)
    exit_s: float | None = None   # fatal: from the fault to mpiexec's exit
    rc: int | None = None
    named: bool = False
    hung: bool = False
    orphans: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)


def survivable(kind: str, job: Job, world: World, rng: random.Random, run: Path, attempt: int) -> Outcome:
    sim = rng.choice(world.sim_ranks)
    out = Outcome(kind, attempt, False, sim, "env child of simulator")
    pid = job.ranks().get(sim)
    children = job.env_children(pid) if pid else []
    if not children:
        out.note = "no env child found"
        return out
    os.kill(rng.choice(children), signal.SIGKILL if kind == "env_child_kill" else signal.SIGSTOP)
    v0 = committed_version(run)
    out.ok = wait_for(lambda: committed_version(run) >= v0 + 2 or job.proc.poll() is not None, 60.0, 0.2)
    out.ok = out.ok and job.proc.poll() is None
    if not out.ok:
        out.note = "the job ended" if job.proc.poll() is not None else "no new version within 60 s"
    return out


def signalled(kind: str, job: Job, world: World, rng: random.Random, attempt: int) -> Outcome:
    role, sig = SIGNALLED[kind]
    ranks = {"simulator": world.sim_ranks, "generator": world.gen_ranks, "trainer": world.train_ranks}[role]
    victim = rng.choice(ranks)
    out = Outcome(kind, attempt, True, victim, role)
    os.kill(job.ranks()[victim], sig)
    return finish_fatal(out, job, time.monotonic())


def at_point(kind: str, job: Job, world: World, attempt: int) -> Outcome:
    """The armed rank kills itself at the fault point: find which, and when. A rank that dies
    before its pid is seen (the first publish is at start-up) is named from mpiexec's report,
    with no time to exit."""
    out = Outcome(kind, attempt, True)
    seen: dict[int, int] = {}

    def dead() -> list[int]:   # mpiexec takes the others down within milliseconds: keep the armed role's
        if len(seen) < world.size:   # a /proc scan per poll only until every rank was seen
            seen.update(job.ranks())
        return [r for r, pid in seen.items() if gone(pid) and POINT_ROLE[kind] in world.role_name(r)]

    reached = wait_for(lambda: bool(dead()) or job.proc.poll() is not None, 90.0, 0.02)
    t, lost = time.monotonic(), dead()
    if not reached:
        out.note = "the point was not reached within 90 s"
        out.orphans = job.sweep()
        return out
    if lost:   # two Simulators may reach their n-th write together: the first to die is named
        out = finish_fatal(out, job, t, candidates=lost)
    else:
        job.wait(EXIT_TIMEOUT)
        m = MPI_REPORT.search(job.output())
        out.rank = int(m[1]) if m else None
        out = finish_fatal(out, job, None)
    out.role = world.role_name(out.rank) if out.rank is not None else ""
    return out


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for its parent counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def finish_fatal(out: Outcome, job: Job, t_fault: float | None, candidates: list[int] | None = None) -> Outcome:
    exited = job.wait(EXIT_TIMEOUT)
    out.exit_s = time.monotonic() - t_fault if t_fault is not None else None
    out.hung = not exited
    out.orphans = job.sweep() if not exited else job.outlived()
    out.rc = job.proc.returncode
    text, ranks = job.output(), candidates or [out.rank]
    named = [r for r in ranks if f"rank {r}" in text]
    out.rank, out.named = (named or ranks)[0], bool(named)
    out.ok = exited and out.rc != 0 and out.named and not out.orphans
    return out


# ---------------------------------------------------------------- the benchmark
def started(job: Job, run: Path) -> bool:
    """The job published a new shard within START_TIMEOUT and still runs."""
    n0 = len(shards.scan(run / "shards"))
    wait_for(lambda: len(shards.scan(run / "shards")) > n0 or job.proc.poll() is not None, START_TIMEOUT, 0.2)
    return job.proc.poll() is None and len(shards.scan(run / "shards")) > n0


def run_attempt(cfg, world: World, run: Path, logs: Path, attempt: int, rng: random.Random) -> tuple[list[Outcome], dict]:
    """One job: its survivable faults, then its fatal one. Returns the outcomes and what the
    resume (if it was one) said against what the disk said before it."""
    expect = lost_weight_shards(run) if cfg.resume else None
    fatal = rng.choice(FATAL)
    point = f"{fatal}:{rng.randint(1, 3)}" if fatal in faults.POINTS else None
    job = Job(cfg, world, run, logs / f"attempt{attempt:03d}.log", point)
    outcomes: list[Outcome] = []
    try:
        if point:   # armed: it may fire before the first shard (the first publish is at start-up)
            outcomes.append(at_point(fatal, job, world, attempt))
        elif not started(job, run):
            outcomes.append(Outcome("start", attempt, True, note=f"no new shard (exit {job.proc.poll()}): see {job.log}"))
        else:
            for _ in range(rng.randint(0, 2)):
                time.sleep(rng.uniform(0.2, 2.0))
                outcomes.append(survivable(rng.choice(list(SURVIVABLE)), job, world, rng, run, attempt))
                if job.proc.poll() is not None:
                    break
            if job.proc.poll() is None:
                time.sleep(rng.uniform(0.2, 2.0))
                outcomes.append(signalled(fatal, job, world, rng, attempt))
    finally:
        job.sweep()   # nothing of this job may hold the run folder when the next one starts
    resume = {}
    if expect is not None and (m := RELABELLED.search(job.output())):
        resume = {"version": int(m[2]), "expected": expect, "said": int(m[1])}
    return outcomes, resume


def final_run(cfg, run: Path, logs: Path, versions: int) -> subprocess.CompletedProcess:
    cfg = config.replace(cfg, resume=True, algo={"max_versions": versions})
    cfg, world = prepare_run_dir(cfg, run)
    with open(logs / "final.log", "w") as f:
        proc = subprocess.run(mpiexec_command(cfg, world.size, run), env=mpi_env(), stdout=f, stderr=subprocess.STDOUT,
                              timeout=300, start_new_session=True)
    return proc


def report(outcomes: list[Outcome], resumes: list[dict], republish: Counter, audit: dict, final_rc: int,
           minutes: float, attempts: int) -> tuple[str, bool]:
    lines = [f"{attempts} jobs in {minutes:.1f} min; faults injected by kind:"]
    kinds = Counter(o.kind for o in outcomes)
    for kind in [*SURVIVABLE, *FATAL, "start"]:
        got = [o for o in outcomes if o.kind == kind]
        if got:
            what = "survived" if kind in SURVIVABLE else "ended the job naming the rank, no orphan"
            lines.append(f"  {kind:16s} {kinds[kind]:3d}   {sum(o.ok for o in got)}/{len(got)} {what}")
    fatal = [o for o in outcomes if o.fatal and o.rc is not None]
    if fatal:
        ex = sorted(o.exit_s for o in fatal if o.exit_s is not None) or [float("nan")]
        lines.append(f"fatal faults: time to exit p50 {statistics.median(ex):.1f} s, max {ex[-1]:.1f} s; hung "
                     f"{sum(o.hung for o in fatal)}; rank named {sum(o.named for o in fatal)}/{len(fatal)}; "
                     f"orphan processes {sum(o.orphans for o in fatal)}")
        by_role = Counter(f"{o.role} rank {o.rank}" for o in fatal)
        lines.append("  ranks lost: " + ", ".join(f"{k} x{n}" for k, n in sorted(by_role.items())))
    for o in outcomes:
        if not o.ok:
            lines.append(f"  NOT OK: attempt {o.attempt} {o.kind} rank {o.rank}: {o.note or vars(o)}")
    lost_expected = sum(r["expected"][1] for r in resumes)
    mislabelled = sum(abs(r["expected"][1] - r["said"]) for r in resumes)
    lines.append(f"resumes: {len(resumes)}; rescanned shards of lost weights: {lost_expected} on disk, "
                 f"{lost_expected - mislabelled} relabelled stale")
    lines.append(f"resumed versions republished with their own weights: {republish['same']}/"
                 f"{republish['same'] + republish['other']} ({republish['unverifiable']} unverifiable: the "
                 f"original publish record died with its rank)")
    reused = republish["other"] + mislabelled
    lines.append(f"final resume to v{audit['versions']}: exit {final_rc}; {audit['rows']} rows in the trained steps")
    lines.append(f"rows lost: {audit['lost']}   rows trained twice: {audit['twice']}   version numbers reused: {reused}"
                 f"   quarantined shards: {len(audit['quarantined'])}   rows_trained {audit['rows_trained']} = "
                 f"versions x rollout_batch {audit['expected']} = ledger {audit['ledger_total']}")
    ok = (final_rc == 0 and audit["lost"] == audit["twice"] == reused == 0 and not audit["quarantined"]
          and audit["rows_trained"] == audit["expected"] == audit["ledger_total"] and all(o.ok for o in outcomes))
    lines.append("PASS" if ok else "FAIL")
    return "\n".join(lines), ok


def run(a) -> int:
    rng = random.Random(a.seed)
    root = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-faults-"))
    run, logs = root / "run", root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = compose([*WORKLOAD, *a.overrides])
    t0 = time.monotonic()
    outcomes: list[Outcome] = []
    resumes: list[dict] = []
    attempt, world = 0, None
    while time.monotonic() - t0 < a.minutes * 60:
        cfg, world = prepare_run_dir(config.replace(base, resume=attempt > 0), run)
        got, resume = run_attempt(cfg, world, run, logs, attempt, rng)
        for o in got:
            print(f"  attempt {attempt:3d} {o.kind:16s} rank {o.rank} ({o.role}) "
                  + (f"exit in {o.exit_s:.1f} s rc {o.rc} named={o.named}" if o.exit_s is not None else "")
                  + ("" if o.ok else f" NOT OK {o.note}"), flush=True)
        outcomes += got
        if resume:
            resumes.append(resume)
        attempt += 1
        if any(o.kind == "start" for o in got):
            break   # a job that cannot start would fail every later attempt the same way
    final = final_run(base, run, logs, committed_version(run) + 2)
    audit = audit_rows(run, base.algo.rollout_batch)
    republish = republish_check(publishes_by_attempt(run, world.train_ranks[0]))
    text, ok = report(outcomes, resumes, republish, audit, final.returncode, (time.monotonic() - t0) / 60, attempt)
    print(f"\nworkload: emulated, envs in child processes {' '.join(a.overrides)}\n{text}\nrun folder: {root}")
    (root / "faults.json").write_text(json.dumps({"outcomes": [vars(o) for o in outcomes], "resumes": resumes,
                                                  "republish": dict(republish), "audit": audit}, indent=1, default=str))
    return 0 if ok else 1
