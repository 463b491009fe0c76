"""The console of a run: third-party notices go to the process's notice log, not the
console (unless runtime.verbose); no ANSI codes when the console is not a terminal; progress
lines with an ETA, or a bar redrawn in place on a terminal; a run's last line says how it went."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlvla3 import notices
from rlvla3.engine.progress import Progress

REPO = Path(__file__).resolve().parents[2]


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def test_robosuites_import_notices_go_to_the_notice_log_and_ours_stay(tmp_path):
    """Real robosuite, imported after `keep_out_of_console`: its macro-file and optional-package
    warnings land in <run>/logs/<process>.log; a warning raised in rlvla3 stays on stderr."""
    ours = Path(notices.__file__).resolve().parent / "somewhere.py"
    code = (f"import warnings\nfrom rlvla3 import notices\nnotices.keep_out_of_console({str(tmp_path)!r}, 'rank0000', VERBOSE)\n"
            "import robosuite\n"
            "warnings.warn_explicit('a library notice', UserWarning, '/elsewhere/lib.py', 3)\n"
            f"warnings.warn_explicit('one of ours', UserWarning, {str(ours)!r}, 7)\n")
    quiet = python(code.replace("VERBOSE", "False"))
    assert quiet.returncode == 0, quiet.stderr
    log = (tmp_path / "logs" / "rank0000.log").read_text()
    assert "No private macro file found" in log and "a library notice" in log and "one of ours" not in log
    assert "robosuite" not in quiet.stderr and "a library notice" not in quiet.stderr
    assert "one of ours" in quiet.stderr
    assert "1 process(es)" in notices.summary(tmp_path)

    loud = python(code.replace("VERBOSE", "True"))
    assert "No private macro file found" in loud.stderr and "a library notice" in loud.stderr


def test_output_into_a_file_loses_its_ansi_codes_and_the_ranks_are_told(tmp_path):
    child = "print('\\x1b[1m\\x1b[33mbold\\x1b[0m plain\\x1b[K'); import sys; print('\\x1b[31merr\\x1b[0m', file=sys.stderr)"
    code = (f"import sys\nfrom rlvla3 import notices\n"
            f"sys.exit(notices.run_to_console([sys.executable, '-c', {child!r}], notices.console_env(), 60))")
    out = python(code)   # stdout and stderr are pipes here, as when a run's console goes to a file
    assert out.returncode == 0, out.stderr
    assert out.stdout == "bold plain\n" and out.stderr == "err\n"
    env = python("import json\nfrom rlvla3 import notices\nprint(json.dumps(notices.console_env({})))").stdout
    assert '"NO_COLOR": "1"' in env and f'"{notices.TTY_VAR}": "0"' in env


def test_a_sigterm_to_the_launcher_stops_its_command(tmp_path):
    """`kill <launcher pid>` (a job supervisor, a user) reaches mpiexec through run_to_console, so
    the job ends with its launcher instead of running on without it."""
    import signal

    child = "import os, time; print(os.getpid(), flush=True); time.sleep(120)"
    code = (f"import sys\nfrom rlvla3 import notices\n"
            f"sys.exit(notices.run_to_console([sys.executable, '-c', {child!r}], notices.console_env(), 600))")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        child_pid = int(launcher.stdout.readline())   # the command is up, the handler installed before it
        launcher.send_signal(signal.SIGTERM)
        rc = launcher.wait(30)
    finally:
        launcher.kill()
    assert rc != 0, "the launcher reports the stopped command as a failure"
    assert not Path(f"/proc/{child_pid}").exists(), f"the command (pid {child_pid}) outlived its launcher"


def test_progress_lines_say_the_eta_and_a_terminal_gets_one_bar(capsys):
    lines = Progress(max_versions=4, first_version=0, tty=False)
    for v in (1, 2, 4):
        lines.show(v, "stats")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[train] version    1/4 | stats | ETA 0m0") and out[-1].endswith("| done")
    assert len(out) == 3

    bar = Progress(max_versions=4, first_version=2, tty=True)   # resumed at version 2
    bar.show(3, "stats")
    bar.close()   # stopped before its last version (preempted): the line is ended
    out = capsys.readouterr().out
    assert out.startswith("\r[train] ##################...... 3/4 | stats | ETA") and out.endswith("\n")
    assert out.count("\n") == 1


def test_an_evaluations_progress_says_eval(capsys):
    Progress(max_versions=2, first_version=0, tty=False, label="eval").show(1, "stats")
    assert capsys.readouterr().out.startswith("[eval] version    1/2 | stats")


def launch(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlvla3.launch", *overrides], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.mark.slow
def test_a_failed_job_ends_with_the_first_error_a_rank_raised(tmp_path):
    # policy.device=cuda on a machine without CUDA: the Generator and Trainer ranks raise at start-up,
    # after mpiexec started every rank; MPI's abort banner must not be the last word.
    out = launch("+experiment=toy", "policy.device=cuda", f"run_dir={tmp_path / 'r'}", "runtime.tensorboard=false")
    assert out.returncode != 0
    stdout_last = out.stdout.strip().splitlines()[-1]
    assert stdout_last.startswith("first error: rank "), out.stdout[-2000:]
    assert "(generator)" in stdout_last or "(trainer)" in stdout_last, stdout_last
    assert "policy.device=cuda but this rank sees no CUDA device" in stdout_last, stdout_last


@pytest.mark.slow
def test_a_finished_run_ends_with_its_result(tmp_path):
    out = launch("+experiment=toy", "algo.max_versions=2", f"run_dir={tmp_path / 'r'}", "runtime.tensorboard=false")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-1].startswith("result: 2 versions, ") and "env steps/s, final success 0." in lines[-1], lines[-3:]
    assert any("a uniform-random policy succeeds ~0.21" in ln for ln in lines[:6]), lines[:6]   # what good looks like
