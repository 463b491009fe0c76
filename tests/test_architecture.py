"""The house rules ARCHITECTURE.md states, checked: the wings import one way and form no circle,
and every role a rank hosts implements the one declared role interface its main loop calls."""
from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from rlvla3.cluster.compose import compose
from rlvla3.engine import run as rank_main
from rlvla3.engine.inprocess import InProcessRun
from rlvla3.engine.roles import Role
from tests.conftest import EMULATED_FAST, TOY

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_has_no_import_circle_and_keeps_its_wing_rules():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "import circles: 0" in out.stdout and "imports against the wing rules: 0" in out.stdout


@pytest.mark.parametrize("overrides", [TOY, EMULATED_FAST], ids=["toy", "emulated"])
def test_every_role_implements_the_role_interface(tmp_path, overrides):
    run = InProcessRun(compose([*overrides, "runtime.tensorboard=false"]), tmp_path)
    roles = [r for rank_roles in run.roles for r in rank_roles]
    assert {type(r).__name__ for r in roles} == {"Simulator", "Generator", "Trainer"}
    for r in roles:
        assert isinstance(r, Role), type(r).__name__
        for name in ("step", "deadline", "wake_fds", "expecting", "describe"):
            params = list(inspect.signature(getattr(r, name)).parameters)
            assert params == [], f"{type(r).__name__}.{name} takes {params}: the main loop calls it with none"


def test_the_main_loop_calls_exactly_the_role_interface():
    # What drive/step_roles call on a role is what Role declares: a new call needs a new member.
    source = inspect.getsource(rank_main.drive) + inspect.getsource(rank_main.step_roles)
    declared = {n for n in vars(Role) if not n.startswith("_")} | {"done"}
    called = {name for name in ("step", "done", "deadline", "wake_fds", "expecting", "describe", "close", "stop")
              if f"r.{name}" in source}
    assert called == declared, (called, declared)
