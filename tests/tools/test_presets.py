"""Every preset a user can pick (`conf/experiment/*.yaml`) runs (or one that extends it does,
COVERED_BY): one version at tiny size, over real MPI, with its env (robosuite, Meta-World, LIBERO in its own interpreter) and its policy
family. Composing and validating alone (tests/world/test_config.py) misses what only a run meets: a
family that cannot act on the preset's cameras, a segment the algorithm cannot train.

Tiny size keeps each preset's env, family, algorithm, cameras, chunk and prompt, and shrinks what
only costs time: image size, envs, batch and segment sizes (a GRPO episode fits in two chunks)."""
from __future__ import annotations

import pytest

from rlvla3.cluster.compose import CONF_DIR, compose
from rlvla3.cluster.local import run_local
from rlvla3.policies import execute_steps
from tests.conftest import EMULATED_FAST, needs_mpi, summary

pytestmark = [needs_mpi, pytest.mark.slow]

PRESETS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
# A preset that another extends with only the fields named is run by that one's run (CI time);
# the test below checks that nothing else differs.
COVERED_BY = {"libero_object_grpo": ("libero_object_multitask", {"task_ids", "task_sampling"})}
TINY = ["algo.max_versions=1", "runtime.tensorboard=false", "runtime.progress=false", "env.num_envs=2",
        "sharding.groups_per_rank=1", "algo.segment_steps=2", "algo.rollout_batch=4", "algo.global_batch=4",
        "algo.micro_batch=4", "algo.update_epochs=1", "policy.device=cpu"]


def tiny_overrides(name: str, tmp_path) -> list[str]:
    cfg = compose([f"+experiment={name}"])
    if cfg.env.name == "emulated":
        return [*EMULATED_FAST[1:], "algo.max_versions=1"]   # EMULATED_FAST names the experiment itself
    over = [*TINY]
    if cfg.env.name != "toy":
        over += ["env.image_size=32"]
    if cfg.env.name == "libero":
        over += ["env.hard_reset=false"]   # the same episode, 11x cheaper a reset (tests/envs/test_libero.py)
        if len(cfg.env.task_ids) > 2:      # two tasks are a multi-task run; each scene costs its start-up
            over += [f"env.task_ids=[{cfg.env.task_ids[0]},{cfg.env.task_ids[1]}]"]
    if cfg.algo.name in ("grpo", "raft"):   # whole episodes a segment: two chunks long (as executed)
        over += [f"env.horizon={2 * execute_steps(cfg.policy)}"]
    if cfg.policy.name == "openvla_oft":    # no random-init form: a tiny folder in the released layout
        from rlvla3.benchmarks.families import tiny_released_folder

        folder = tiny_released_folder(compose([f"+experiment={name}", *over]), oft=True, folder=str(tmp_path / "oft"))
        over += [f"policy.pretrained={folder}"]
    return over


def test_a_preset_left_to_another_differs_from_it_only_where_named():
    for name, (by, fields) in COVERED_BY.items():
        mine, theirs = compose([f"+experiment={name}"]), compose([f"+experiment={by}"])
        differ = {k for k in vars(mine.env) if getattr(mine.env, k) != getattr(theirs.env, k)}
        assert differ == fields, (name, by, differ)
        assert mine.policy == theirs.policy and mine.algo == theirs.algo and mine.sharding == theirs.sharding, (name, by)


@pytest.mark.sim
@pytest.mark.parametrize("name", [p for p in PRESETS if p not in COVERED_BY])
def test_every_preset_runs_a_version_at_tiny_size(name, tmp_path):
    cfg = compose([f"+experiment={name}", *tiny_overrides(name, tmp_path)])
    run = tmp_path / "run"
    proc = run_local(cfg, run, timeout=600, capture=True)
    assert proc.returncode == 0, f"+experiment={name}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    s = summary(run)
    assert s["versions"] == 1 and s["rows_trained"] >= cfg.algo.rollout_batch, s
    if cfg.env.name == "libero" and len(cfg.env.task_ids) > 1:   # a multi-task run records each task's success
        rec = s["history"][0]
        per_task = {int(k.removeprefix("episodes_task")): v for k, v in rec.items() if k.startswith("episodes_task")}
        assert per_task and set(per_task) <= set(cfg.env.task_ids) and sum(per_task.values()) == rec["episodes"], rec
