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

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_family_registry_is_what_every_reader_sees():
    # One table of families (policies/registry.py): its readers agree with it, and each family has
    # its preset, its benchmark run and its docs section.
    from rlvla3.benchmarks.families import FAMILY_RUNS
    from rlvla3.benchmarks.memory import PUBLISHED_RUNS
    from rlvla3.policies.registry import FAMILIES, PUBLISHED
    from rlvla3.policies.sampling import CHAIN_FAMILIES, GAUSSIAN_FAMILIES

    assert set(PUBLISHED_RUNS) == set(PUBLISHED) == {"openvla", "openvla_oft", "pi0", "pi05", "smolvla", "gr00t"}
    assert set(CHAIN_FAMILIES) == {"pi0", "pi05", "smolvla", "gr00t"} and set(GAUSSIAN_FAMILIES) == {"openvla_oft"}
    benched = {o.split("=")[1] for runs in FAMILY_RUNS.values() for o in runs if o.startswith("policy=")}
    assert benched == {n for n, f in FAMILIES.items() if f.torch}
    docs = (ROOT / "docs" / "policies.md").read_text()
    for name in FAMILIES:
        assert (ROOT / "conf" / "policy" / f"{name}.yaml").is_file(), name
        assert f"## `{name}`" in docs, f"docs/policies.md has no section for {name}"
    from rlvla3 import config

    reference = (ROOT / "docs" / "configuration.md").read_text()   # generated from the schema's docstrings
    described = next(line for line in reference.splitlines() if '<a id="policy.name">' in line)
    for name in FAMILIES:
        assert f"{name} (" in described or f"| {name}" in described, f"policy.name's description omits {name}: {described}"
    with pytest.raises(config.ConfigError, match="policy.name='nosuch'.*tiny, openvla"):
        from rlvla3.world import derive

        derive(compose(["policy.name=nosuch"]))
