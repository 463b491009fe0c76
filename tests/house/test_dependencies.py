"""What rlvla3 needs is declared, once in pyproject.toml and in step in environment.yml (conda
users), and every third-party module the package imports comes from a declared distribution."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# conda-forge's names for PyPI distributions whose names differ.
CONDA_NAMES = {"torch": "pytorch", "opencv-python-headless": "opencv"}
# Imported, but installed otherwise: by scripts/setup.sh with --no-deps (their pins conflict with
# ours), or inside an env's own interpreter (LIBERO, ManiSkill3), or an optional simulator that
# no package index can install whole (RoboCasa's assets).
NOT_IN_PYPROJECT = {"robosuite", "metaworld", "libero", "mani_skill", "robocasa"}


def requirement(spec: str) -> tuple[str, str]:
    """('name', 'version spec') of a PEP 508 line, extras dropped, name normalised."""
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)", spec)
    return m.group(1).lower().replace("_", "-"), m.group(3).split(";")[0].strip()


def pyproject_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    return dict(requirement(s) for s in specs)


def conda_requirements() -> dict[str, str]:
    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    specs = [s for d in deps for s in (d["pip"] if isinstance(d, dict) else [d])]
    return dict(requirement(s) for s in specs)


def pin(version: str) -> str:
    """A version spec in one spelling: conda's `=1.3.8` is pip's `==1.3.8`, `==2.3.*` is `==2.3`."""
    version = version.replace(" ", "").removesuffix(".*")
    return "=" + version if re.match(r"^=[^=]", version) else version


def test_environment_yml_has_every_requirement_of_pyproject_with_its_pin():
    conda = conda_requirements()
    for name, version in pyproject_requirements().items():
        cname = CONDA_NAMES.get(name, name)
        assert cname in conda, f"{name} (pyproject.toml) is missing from environment.yml"
        if version:
            assert pin(conda[cname]) == pin(version), \
                f"{name}: pyproject.toml says {version}, environment.yml {conda[cname] or 'nothing'}"


def imported_top_modules(folder: Path) -> set[str]:
    mods = set()
    for f in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods.add(node.module.split(".")[0])
    return mods - set(sys.stdlib_module_names) - {"rlvla3", "analysis", "hydra_plugins", "tests"}


def test_every_module_the_package_imports_is_declared():
    declared = set(pyproject_requirements())
    dists = packages_distributions()
    for module in sorted(imported_top_modules(ROOT / "rlvla3") | imported_top_modules(ROOT / "analysis")):
        if module in NOT_IN_PYPROJECT:
            continue
        names = {d.lower().replace("_", "-") for d in dists.get(module, [])}
        assert names, f"{module} is imported but not installed"
        # A module some declared distribution provides (hydra: hydra-core; yaml: pyyaml; PIL: pillow).
        assert names & declared, f"{module} comes from {sorted(names)}, none of which pyproject.toml declares"


def locked_versions() -> dict[str, str]:
    lines = (ROOT / "requirements.lock").read_text().splitlines()
    return dict(requirement(s) for s in lines if s and not s.startswith("#"))


def test_the_lock_pins_every_declared_requirement_within_its_spec():
    """requirements.lock (scripts/lock.sh) holds an exact version of every requirement of
    pyproject.toml, and that version satisfies pyproject's spec: a changed requirement without a
    regenerated lock fails here, not in a user's install."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    locked = locked_versions()
    assert all(v.startswith("==") for v in locked.values()), "requirements.lock holds exact pins only"
    for name, spec in pyproject_requirements().items():
        assert name in locked, f"{name} (pyproject.toml) has no pin in requirements.lock: run scripts/lock.sh"
        version = Version(locked[name].removeprefix("=="))
        assert version in SpecifierSet(spec, prereleases=True), \
            f"{name}: requirements.lock pins {version}, outside pyproject.toml's {spec!r}: run scripts/lock.sh"
