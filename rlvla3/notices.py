"""Third-party notices out of the console.

Libraries announce things at import that the user of a run cannot act on, once per process, and
a run has many processes: robosuite (no private macro file; robosuite_models and mink not
installed), megatron-core (no Transformer Engine or Apex). `keep_out_of_console` sends them to
the process's notice log, `<run>/logs/<process>.log`, instead of stderr; `runtime.verbose=true`
lets them through. rlvla3's own warnings stay on the console. The launcher names the logs (and
how many notices they hold) in its last line.

A rank that raises records the exception's own line (`record_failure`); the launcher ends a
failed job's console with the first one (`first_failure`), not with MPI's abort banner.

`console_env` is what the local launcher adds to the ranks' environment: Open MPI gives local
ranks a pseudo-terminal, so a rank cannot tell by itself whether the user's console is one.

Stdlib only: env children under another interpreter (`env.python`) import it too.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

# Loggers that print through handlers of their own (their records never reach the root logger).
THIRD_PARTY_LOGGERS = ("robosuite_logs",)
OURS = str(Path(__file__).resolve().parent)
TTY_VAR = "RLVLA3_CONSOLE_TTY"   # "1": the launcher's console is a terminal
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")   # CSI sequences: colours, cursor moves, line erases


class _ToFile(logging.Filter):
    """A logger filter that writes each record to the notice log and stops it there."""

    def __init__(self, handler: logging.Handler):
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        self.handler.handle(record)
        return False


def notice_log(run_dir: str | Path, process: str) -> Path:
    return Path(run_dir) / "logs" / f"{process}.log"


def keep_out_of_console(run_dir: str | Path, process: str, verbose: bool) -> Path | None:
    """From now on, this process's third-party notices (the loggers above, and Python warnings
    raised outside rlvla3) go to `notice_log(run_dir, process)`, created at the first one. Call it
    before importing the libraries: what they say at import is what this is for. Returns the log's
    path, or None when `verbose` (or no run folder) leaves the console as it is."""
    if verbose or not run_dir:
        return None
    path = notice_log(run_dir, process)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s %(levelname)s] %(message)s"))
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).addFilter(_ToFile(handler))
    console = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if file is not None or str(filename).startswith(OURS):
            return console(message, category, filename, lineno, file, line)
        with open(path, "a") as f:
            f.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = show
    return path


def prints_to_log(run_dir: str | Path, process: str, verbose: bool) -> Path | None:
    """From now on, whatever this process prints on its standard output, at the Python or the C
    level, goes to its notice log (an env child: LIBERO's "[info] Applying task order index ...",
    once per process). Only for processes whose own output is never meant for the user (env
    children answer over a pipe); their stderr, with any traceback, stays on the console."""
    if verbose or not run_dir:
        return None
    path = notice_log(run_dir, process)
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.close(fd)
    return path


def console_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What the ranks need to know of the launcher's console: whether it is a terminal (the
    progress bar), and, when it is not, NO_COLOR (https://no-color.org: robosuite's termcolor and
    most libraries then write no ANSI codes into a log file)."""
    environ = dict(os.environ if environ is None else environ)
    tty = sys.stdout.isatty()
    environ[TTY_VAR] = "1" if tty else "0"
    if not tty:
        environ.setdefault("NO_COLOR", "1")
    return environ


def console_is_tty() -> bool:
    """In a rank: whether the user's console is a terminal (as the launcher saw it)."""
    return os.environ.get(TTY_VAR) == "1"


def summary(run_dir: str | Path) -> str | None:
    """One line naming the notice logs of a run and how many notices they hold, or None."""
    logs = sorted((Path(run_dir) / "logs").glob("*.log"))
    count = 0
    for f in logs:
        count += sum(1 for ln in f.read_text(errors="replace").splitlines() if ln and not ln.startswith(" "))
    if not count:
        return None
    return (f"{count} third-party notice(s) kept out of the console: {Path(run_dir) / 'logs'}/ "
            f"({len(logs)} process(es); runtime.verbose=true shows them)")


def run_to_console(cmd: list[str], env: dict[str, str], timeout: float) -> int:
    """Run `cmd` with its output on our console. On a terminal it writes there directly; into a
    file or a pipe its lines pass through here with ANSI sequences removed (some simulator code
    writes colour resets whatever NO_COLOR says). On `timeout` the command is killed and
    subprocess.TimeoutExpired raised, as subprocess.run does. A SIGTERM to this process is passed
    on to the command (mpiexec ends its ranks on it): stopping a launcher by its pid stops its
    job instead of leaving the ranks running without it."""
    tty = sys.stdout.isatty()
    pipes = {} if tty else {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "errors": "replace"}
    with subprocess.Popen(cmd, env=env, **pipes) as proc, sigterm_passed_on(proc):
        pumps = [] if tty else [threading.Thread(target=_pump, args=(src, dst), daemon=True)
                                for src, dst in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
        for t in pumps:
            t.start()
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        except KeyboardInterrupt:   # Ctrl-C reached the command too: it gets time to end its ranks
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        for t in pumps:
            t.join(10)
        return rc


@contextlib.contextmanager
def sigterm_passed_on(proc: subprocess.Popen):
    """While in the block, SIGTERM to this process goes to `proc` instead (main thread only: a
    signal handler cannot be set from another)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _pump(src, dst) -> None:
    for line in src:
        dst.write(ANSI.sub("", line))
        dst.flush()


def record_failure(run_dir: str | Path, rank: int, role: str, exc: BaseException) -> None:
    """Write what `rank` raised, one line, for the launcher's last line (`first_failure`). Best
    effort: a failure to write must never hide the exception being reported."""
    line = traceback.format_exception_only(type(exc), exc)[-1].strip().splitlines()[0]
    path = Path(run_dir) / "logs" / f"failure-rank{rank:04d}.json"
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"time": time.time(), "rank": rank, "role": role, "error": line}))
        os.replace(tmp, path)


def first_failure(run_dir: str | Path) -> str | None:
    """The earliest exception any rank of the run recorded, as `rank 3 (simulator): <line>`; the
    others usually follow from it (a peer that went silent, an aborted world)."""
    records = []
    for path in (Path(run_dir) / "logs").glob("failure-rank*.json"):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text()))
    if not records:
        return None
    r = min(records, key=lambda r: r["time"])
    return f"rank {r['rank']} ({r['role']}): {r['error']}"
