"""Evaluation while training (`runtime.eval_every`): Trainer 0 hands a version's checkpoint to an
evaluation process and goes on training.

The process is `python -m rlvla3.evaluate --of-run <run>`: the run's env and policy, evaluation
envs of its own (`runtime.eval_envs`, seeds from `runtime.eval_seed`, never the training ones),
one Simulator, Generator and Trainer in one process (no MPI: it is not a rank of this job). It
writes <run>/eval/v<version>/eval.json and its videos; this side reads them back, logs success
and its Wilson interval against the version (metrics/, TensorBoard, W&B), and keeps the best
checkpoint by held-out success as ckpt/best.pt (ckpt/best.dcp for a sharded one: hard links to
that version's files, copies where the filesystem has none) with ckpt/best.json.

The process runs in a process group of its own inside the job's session: the poll's timeout
kills that group, and a launcher that kills the job's session (its timeout) takes it too.

One evaluation runs at a time. A version that comes due while one runs waits; a later one
replaces it (the newest weights are the ones worth judging). An evaluation that fails or passes
`runtime.eval_timeout` is reported; two in a row fail the job, naming the log, rather than
failing silently at every version.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .checkpoints import link_copy

MPI_VARS = ("OMPI_", "PMIX_", "PMI_")   # the child is not a rank: it must not join this job's MPI world


def due(cfg, version: int) -> bool:
    """Whether version `version` is evaluated (every runtime.eval_every, and the last one)."""
    every = cfg.runtime.eval_every
    return bool(every) and (version % every == 0 or version >= cfg.algo.max_versions)


class EvaluationError(RuntimeError):
    """Evaluations keep failing: the job stops rather than train on without them."""


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(MPI_VARS)}


class Evaluator:
    def __init__(self, cfg, run_dir: Path, say=print):
        self.cfg, self.run_dir, self.say = cfg, Path(run_dir), say
        self.running: tuple[int, Path, subprocess.Popen, float] | None = None   # (version, checkpoint, process, deadline)
        self.waiting: tuple[int, Path] | None = None
        self.failures = 0
        best = self.run_dir / "ckpt" / "best.json"
        self.best = json.loads(best.read_text()) if best.is_file() else None   # kept across a resume

    def submit(self, version: int, ckpt: Path) -> None:
        if self.waiting is not None:
            self.say(f"[eval] version {self.waiting[0]} not evaluated: version {version} replaces it")
        self.waiting = (version, ckpt)
        self._start_waiting()

    def in_use(self) -> set[str]:
        """The checkpoint files an evaluation still reads (running or waiting; the best one is
        linked from its version's file when the evaluation ends)."""
        return {x[1].name for x in (self.running, self.waiting) if x is not None}

    def out_dir(self, version: int) -> Path:
        return self.run_dir / "eval" / f"v{version:06d}"

    def log_path(self, version: int) -> Path:
        """The evaluation process's output (what a failure message points to)."""
        return self.run_dir / "logs" / f"eval-v{version:06d}.log"

    def _start_waiting(self) -> None:
        if self.running is not None or self.waiting is None:
            return
        (version, ckpt), self.waiting = self.waiting, None
        r = self.cfg.runtime
        out = self.out_dir(version)
        log = self.log_path(version)
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "rlvla3.evaluate", "--of-run", str(self.run_dir), "--checkpoint", str(ckpt),
               "--episodes", str(r.eval_episodes), "--seed", str(r.eval_seed), "--videos", str(r.eval_videos),
               "--out", str(out), "--timeout", str(r.eval_timeout)]
        with open(log, "w") as f:   # the child holds its own descriptor
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=child_env(), process_group=0)   # its own group, in the job's session
        self.running = (version, ckpt, proc, time.monotonic() + r.eval_timeout + 60)   # + its own start-up and teardown

    def poll(self) -> list[dict]:
        """Results of the evaluations that ended since the last call (each once)."""
        if self.running is None:
            return []
        version, ckpt, proc, deadline = self.running
        if proc.poll() is None:
            if time.monotonic() < deadline:
                return []
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.running = None
        result = self._result(version, ckpt, proc.returncode)
        self._start_waiting()
        return [] if result is None else [result]

    def _result(self, version: int, ckpt: Path, rc: int) -> dict | None:
        out = self.out_dir(version) / "eval.json"
        if rc != 0 or not out.is_file():
            self.failures += 1
            why = "stopped after runtime.eval_timeout" if rc == -signal.SIGKILL else f"exit code {rc}"
            msg = f"evaluation of version {version} failed ({why}); its output: {self.log_path(version)}"
            if self.failures >= 2:
                raise EvaluationError(f"{msg}; {self.failures} evaluations in a row failed: set runtime.eval_every=0 "
                                      "to train without them, or fix what the log says")
            self.say(f"[eval] {msg}")
            return None
        self.failures = 0
        r = json.loads(out.read_text())
        videos = sorted((self.out_dir(version) / "videos").glob("*.mp4"))
        result = {"version": version, "success": r["success_rate"], "success_lo": r["wilson95"][0],
                  "success_hi": r["wilson95"][1], "episodes": r["episodes"], "videos": videos}
        self._keep_best(result, ckpt)
        return result

    def _keep_best(self, result: dict, src: Path) -> None:
        """ckpt/best.pt (or best.dcp): the version with the highest held-out success so far (the
        earlier on a tie)."""
        if self.best is not None and result["success"] <= self.best["success"]:
            return
        best = src.with_name("best" + src.suffix)
        link_copy(src, best)   # the same bytes, no copy; the version's own checkpoint stays as it is
        self.best = {k: result[k] for k in ("version", "success", "success_lo", "success_hi", "episodes")}
        (src.parent / "best.json").write_text(json.dumps({**self.best, "checkpoint": src.name}, indent=1))
        result["best"] = best

    def finish(self) -> list[dict]:
        """At the job's end: wait for the evaluations still to come (each bounded by its deadline)."""
        results = []
        while self.running is not None:
            results += self.poll()
            time.sleep(0.2)
        return results
