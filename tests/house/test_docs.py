"""The documentation cannot rot: every documented command parses, and the configuration reference
is the schema's own text.

Every `python -m rlvla3.<command> ...` in README.md and docs/ (code blocks and inline code) is
parsed as the command would parse it: the tool's argparse accepts its flags, and Hydra composes
its overrides over the schema (a misspelt field, a missing preset or a wrong type fails), without
running anything. A bare `python -m rlvla3.<command>` in running text names the command (it must
exist) rather than running it. Placeholders in angle brackets (`<run>`, `<pi05 dir>`) stand for a value, `...` for other arguments; an
optional part in square brackets (`[--ladder]`) is checked as if given; of alternatives written
`a|b` the first is checked.
"""
from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PLACEHOLDER = "PLACEHOLDER"

# `python -m rlvla3.<name>` -> the module whose parser() reads its options (None: Hydra's own command line).
COMMANDS = {
    "launch": None,
    "collect": "rlvla3.tools.collect",
    "sft": "rlvla3.tools.sft",
    "openloop": "rlvla3.tools.openloop",
    "evaluate": "rlvla3.tools.evaluate",
    "recipe": "rlvla3.tools.recipe",
    "bench": "rlvla3.benchmarks.cli",
    "plan": "rlvla3.planner.cli",
    "scale": "rlvla3.cluster.scale",
}
# Modules the launcher starts on every rank: documented, never typed by a user.
RANK_MAINS = {"engine.run", "cluster.slurm"}
# Placeholder values where the field's type is not a string.
TYPED_PLACEHOLDERS = {"env.task_ids": "[0]", "seed": "0"}


def fenced_lines(text: str):
    """(line, in a code block) for each line, with shell continuations (trailing backslash) joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        yield line, fenced


def documented_commands(text: str) -> list[tuple[str, bool]]:
    """Every `python -m rlvla3.<...>` command written in a markdown text, as written, and whether it
    is a mention (running text's inline code naming a command without arguments)."""
    found = []
    for line, fenced in fenced_lines(text):
        spans = [line] if fenced else re.findall(r"`([^`]+)`", line)
        for span in spans:
            for m in re.finditer(r"python -m rlvla3\.\S+.*", span):
                command = cut_command(m.group(0))
                found.append((command, not fenced and len(command.split()) == 3))
    return found


def cut_command(text: str) -> str:
    """The command alone: without a trailing comment, a pipe or a following shell command."""
    for end in (" #", " && ", "; ", " | ", " > ", " 2>"):
        text = text.split(end)[0]
    return " ".join(text.split())


def tokens(command: str) -> list[str]:
    """The command's arguments after `python -m rlvla3.<name>`, placeholders and optional parts resolved."""
    command = re.sub(r"<[^<>]*>", PLACEHOLDER, command)
    command = re.sub(r"(?<=\s)\[([^\[\]]*)\]", r"\1", command)   # [--flag value] -> --flag value
    words = shlex.split(command)[3:]
    return [w if "=[" in w or "|" not in w else w.split("|")[0] for w in words if w != "..."]   # ...: other arguments


def typed(override: str) -> str:
    key, _, value = override.partition("=")
    return f"{key}={TYPED_PLACEHOLDERS[key.lstrip('+')]}" if PLACEHOLDER in value and key.lstrip("+") in TYPED_PLACEHOLDERS \
        else override


def first_sweep_point(overrides: list[str]) -> list[str]:
    """A `-m` sweep's first point: `algo.lr=1e-5,3e-5` -> `algo.lr=1e-5` (Hydra's own parser)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    return [f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
            for o in parsed]


def check_command(command: str, mention: bool = False) -> None:
    """Raise (SystemExit from argparse, or Hydra's/the schema's error) if the command would not parse."""
    from rlvla3.cluster.compose import compose

    args = tokens(command)
    name = command.split()[2].removeprefix("rlvla3.")
    if name in RANK_MAINS:
        return
    if name not in COMMANDS:
        raise ValueError(f"python -m rlvla3.{name}: no such command (known: {', '.join(COMMANDS)})")
    if mention:
        return
    if COMMANDS[name] is None:
        flags = [a for a in args if a.startswith("-")]
        if set(flags) - {"-m", "--multirun"}:
            raise ValueError(f"launch takes Hydra overrides and -m, not {flags}")
        overrides = [a for a in args if not a.startswith("-")]
    else:
        module = importlib.import_module(COMMANDS[name])
        if name == "bench" and args[:1] == ["fidelity"]:
            module, args = importlib.import_module("rlvla3.tools.libero_fidelity"), args[1:]
        parsed = module.parser().parse_intermixed_args(args)
        overrides = getattr(parsed, "overrides", [])
    compose(first_sweep_point([typed(o) for o in overrides]))


ALL = [(page.relative_to(ROOT).as_posix(), cmd, mention) for page in PAGES for cmd, mention in documented_commands(page.read_text())]


def test_the_pages_document_commands():
    # The check below is only as good as what it finds: the guide's commands are all there.
    names = {cmd.split()[2] for _, cmd, _ in ALL}
    assert sum(not mention for *_, mention in ALL) >= 40, ALL
    assert {"rlvla3.launch", "rlvla3.evaluate", "rlvla3.sft", "rlvla3.bench", "rlvla3.plan"} <= names, names


@pytest.mark.parametrize("page,command,mention", ALL, ids=[f"{p}:{i}" for i, (p, *_) in enumerate(ALL)])
def test_documented_command_parses(page, command, mention):
    try:
        check_command(command, mention)
    except SystemExit as e:   # argparse's error went to stderr; name the command and page
        pytest.fail(f"{page}: `{command}` is refused by its parser (exit {e.code})")
    except Exception as e:
        pytest.fail(f"{page}: `{command}` does not compose: {type(e).__name__}: {e}")


@pytest.mark.parametrize("good,bad", [
    ("python -m rlvla3.plan show --profile p.yaml --gpus 8",        # a subcommand that does not exist
     "python -m rlvla3.plan emulate --profile p.yaml --gpus 8"),
    ("python -m rlvla3.launch algo.lr=1e-4", "python -m rlvla3.launch algo.nosuch=1"),   # a field that does not exist
    ("python -m rlvla3.launch env=toy", "python -m rlvla3.launch env=nosuch"),           # a preset that does not exist
    ("python -m rlvla3.launch algo.lr=1e-4", "python -m rlvla3.launch algo.lr=fast"),    # a wrong type
    ("python -m rlvla3.evaluate --checkpoint x.pt --episodes 5",                        # a misspelt flag
     "python -m rlvla3.evaluate --checkpoint x.pt --epsiodes 5"),
    ("python -m rlvla3.sft --demos <demos> policy.chunk=2",                             # a tool's override
     "python -m rlvla3.sft --demos <demos> policy.nosuch=1"),
    ("python -m rlvla3.launch -m algo.lr=1e-5,3e-5", "python -m rlvla3.launch --cfg job"),   # launch takes overrides only
    ("python -m rlvla3.launch +experiment=toy", "python -m rlvla3.train +experiment=toy"),   # a command that does not exist
])
def test_a_wrong_command_is_caught(good, bad):
    check_command(good)   # the same check passes the command written right
    with pytest.raises((SystemExit, ValueError, Exception)) as e:
        check_command(bad)
    assert not isinstance(e.value, (ImportError, AttributeError, TypeError)), e.value   # refused, not broken


def test_placeholders_and_optional_parts():
    assert tokens("python -m rlvla3.bench throughput [--ladder] [--env emulated|robosuite]") == \
        ["throughput", "--ladder", "--env", "emulated"]
    assert tokens('python -m rlvla3.launch policy.pretrained=<pi05 dir> "env.task_ids=[3]"') == \
        [f"policy.pretrained={PLACEHOLDER}", "env.task_ids=[3]"]
    assert documented_commands("x `python -m rlvla3.launch +experiment=toy` and\n```\npython -m rlvla3.sft \\\n  --demos d"
                               " --steps 5   # comment\n```\n`python -m rlvla3.openloop` says") == [
        ("python -m rlvla3.launch +experiment=toy", False), ("python -m rlvla3.sft --demos d --steps 5", False),
        ("python -m rlvla3.openloop", True)]


def test_configuration_reference_is_current():
    # docs/configuration.md is generated from rlvla3/config.py's field docstrings.
    r = subprocess.run([sys.executable, "scripts/config_reference.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_schema_field_is_in_the_reference():
    import dataclasses

    from rlvla3 import config

    page = (ROOT / "docs" / "configuration.md").read_text()
    run = config.RunConfig()
    for section in dataclasses.fields(run):
        value = getattr(run, section.name)
        names = [f"{section.name}.{f.name}" for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) \
            else [section.name]
        for name in names:
            assert f'<a id="{name}"></a>' in page, name
