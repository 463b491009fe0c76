"""`python -m rlvla3.evaluate --protocol libero --checkpoint CKPT [env.suite=SUITE] [overrides...]`:
LIBERO's standard evaluation, as the published evaluation scripts run it, over the engine.

Every task of the suite (or env.task_ids) x N fixed initial states (--states, default the
suite's 50), one episode each, on the engine's Simulator ranks (no training: runtime.evaluate).
Episode seeds run 0..tasks*N-1 (env.seed_order=sequential) and the LIBERO env maps seed -> (task,
fixed state) (`libero_env.episode_of`), so each pair is visited exactly once; each shard records
its episodes' reset seeds, which the count below checks. --repeats R (all 50 states, sampled
actions) visits each pair R times: seeds run on to tasks*50*R-1 and wrap onto the same states, the
episodes differing only in the policy's sampling noise; the interval then counts every episode,
which for a fixed set of states is conservative (stratified by state, the rate's variance is at
most the binomial's). The step limit is the suite's
(spatial 220, object 280, goal 300, libero_10 520, libero_90 400), after env.settle_steps no-op
steps (default 10). --max-steps shortens it (for tests); the report then says it is not the protocol.

LIBERO-PRO's perturbation suites (`env.suite=libero_object_swap`, ...: libero_env.PERTURBATIONS)
run the same way, on their own fixed states at the standard suite's step limit; the report says
what the suite changes. `--generalization` runs the checkpoint over env.suite (a standard suite)
and each of its perturbations (--perturbations, default all five) into <out>/<suite>/, and prints
one table: success with its Wilson interval per suite, and what each one changes; a perturbation
whose files the installed package lacks is named as not run.

Writes protocol.json (per task and per suite: successes, episodes, rate, 95% Wilson interval, mean
episode length in env steps; the robosuite / mujoco / LIBERO versions the episodes ran on; wall
time) and protocol.png (success per task with its interval) in the run folder. A checkpoint whose
run folder says it trained on the fixed states (init_states.json) is refused: its result would
not be held out (--allow-train-states evaluates it anyway and says so).
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path


def protocol_overrides(overrides: list[str]) -> list[str]:
    """The user's overrides, on env=libero unless they name an env (which main then checks)."""
    if not any(o.startswith("env=") for o in overrides):
        overrides = ["env=libero", *overrides]
    return overrides


def protocol_env(cfg, states: int, max_steps: int, tasks_given: bool) -> dict:
    """The env section of a protocol run of `cfg`'s suite."""
    from ..envs.libero_env import FIXED_STATES, MAX_STEPS, SUITES

    if not 1 <= states <= FIXED_STATES:
        raise SystemExit(f"--states={states}: LIBERO has {FIXED_STATES} fixed initial states per task; use 1..{FIXED_STATES}")
    if max_steps < 0:
        raise SystemExit(f"--max-steps={max_steps}: must be >= 1 (or 0: the suite's own limit)")
    suite = cfg.env.suite
    task_ids = list(cfg.env.task_ids) if tasks_given else list(range(SUITES[suite]))
    # Hard resets, as the published evaluation scripts reset (training may reset softly: env.hard_reset).
    return {"task_ids": task_ids, "init_states": "fixed", "seed_order": "sequential",
            "horizon": max_steps or MAX_STEPS[suite], "hard_reset": True}


def refuse_trained_on_test_states(checkpoint: Path, suite: str, allow: bool) -> str:
    """'' if the checkpoint's run did not train on the suite's fixed states, else a warning
    (with --allow-train-states) or an exit naming the record that says so. The record is the
    run folder's (<run>/ckpt/vNNNNNN.pt) or, for an SFT checkpoint, its demonstrations' copied
    beside it (<stem>.init_states.json)."""
    from ..envs.libero_env import state_records

    record = next((r for r in state_records(checkpoint) if uses_test_states(json.loads(r.read_text()), suite)), None)
    if record is None:
        return ""
    msg = (f"{checkpoint} was trained on {suite}'s fixed initial states, the protocol's test states "
           f"({record}: env.init_states=fixed, in that run or the checkpoint it started from); "
           "train with env.init_states=sampled for a held-out result")
    if not allow:
        raise SystemExit(msg + ", or pass --allow-train-states to evaluate it anyway")
    return "not held out: " + msg


def uses_test_states(split: dict, suite: str) -> bool:
    """Whether an init_states.json record says a training run, or the checkpoint it started from
    (its init_from records), used `suite`'s fixed (test) states."""
    ancestors = (split.get("init_from") or {}).get("records", [])
    return (split.get("purpose") == "training" and bool(split.get("uses_test_states")) and split.get("suite") == suite
            or any(uses_test_states(r, suite) for r in ancestors))


def sim_facts(cfg) -> dict:
    """Package versions and task instructions, read in the env's own interpreter (libero_env.facts)."""
    from ..envs import SOURCE_ROOT, interpreter
    from ..envs.hosting import foreign_env

    code = "import json, sys; from rlvla3.envs.libero_env import facts; print(json.dumps(facts(sys.argv[1])))"
    p = subprocess.run([str(interpreter(cfg)), "-c", code, cfg.env.suite], capture_output=True, text=True, timeout=300,
                       cwd=SOURCE_ROOT, env=foreign_env())
    if p.returncode != 0:
        raise SystemExit(f"env.python={cfg.env.python}: could not read LIBERO's versions and tasks:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def check_repeats(repeats: int, states: int, greedy: bool) -> None:
    """--repeats: each fixed state more than once needs all of them (the env wraps seeds onto the
    50 states) and sampled actions (greedy repeats would replay the same episode)."""
    from ..envs.libero_env import FIXED_STATES

    if repeats < 1:
        raise SystemExit(f"--repeats={repeats}: must be >= 1")
    if repeats > 1 and states != FIXED_STATES:
        raise SystemExit(f"--repeats={repeats} with --states={states}: repeats visit all {FIXED_STATES} fixed states; "
                         f"use --states {FIXED_STATES}")
    if repeats > 1 and greedy:
        raise SystemExit(f"--repeats={repeats} with --greedy: a greedy policy replays the same episode from a state; "
                         "use --repeats 1")


def tabulate(episodes: dict[int, tuple[bool, int]], task_ids: list[int], per_task: int) -> dict:
    """Per task and for the suite: successes, episodes, rate, Wilson interval, mean length, of
    seeds 0..tasks*per_task-1."""
    from ..envs.libero_env import episode_of
    from .episodes import wilson

    want = len(task_ids) * per_task
    missing = [s for s in range(want) if s not in episodes]
    if missing:
        raise RuntimeError(f"protocol: {len(missing)} of {want} episodes never ran (reset seeds {missing[:10]}...); "
                           "an env restarted mid-run replays no seed: run again")
    per_task = {t: [] for t in task_ids}
    for seed in range(want):
        task, _ = episode_of(seed, task_ids)
        per_task[task].append(episodes[seed])

    def row(eps: list[tuple[bool, int]]) -> dict:
        succ = sum(s for s, _ in eps)
        lo, hi = wilson(succ, len(eps))
        return {"successes": succ, "episodes": len(eps), "success_rate": succ / len(eps), "wilson95": [lo, hi],
                "mean_length": sum(n for _, n in eps) / len(eps)}

    return {"tasks": {t: row(e) for t, e in per_task.items()}, "suite": row([e for es in per_task.values() for e in es])}


def read_episodes(run_dir: Path, versions: int) -> dict[int, tuple[bool, int]]:
    """reset seed -> (success, env steps) of every episode of the first `versions` rollout steps."""
    from .episodes import whole_episodes

    out: dict[int, tuple[bool, int]] = {}
    for seed, success, length in whole_episodes(run_dir, versions):
        if seed in out:
            raise RuntimeError(f"protocol: reset seed {seed} ran twice in {run_dir / 'shards'}")
        out[seed] = (success, length)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = result["tasks"]
    names = list(tasks)
    rate = [tasks[t]["success_rate"] for t in names]
    lo = [r - tasks[t]["wilson95"][0] for r, t in zip(rate, names)]
    hi = [tasks[t]["wilson95"][1] - r for r, t in zip(rate, names)]
    s = result["suite"]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names) + 2), 3.8))
    ax.axhspan(*s["wilson95"], color="0.85", label=f"suite 95% Wilson [{s['wilson95'][0]:.3f}, {s['wilson95'][1]:.3f}]")
    ax.axhline(s["success_rate"], color="0.4", ls="--", lw=1, label=f"suite {s['successes']}/{s['episodes']}")
    ax.bar(range(len(names)), rate, yerr=[lo, hi], capsize=3, color="tab:blue", label="task (95% Wilson)")
    ax.set_xticks(range(len(names)), [str(t) for t in names])
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"{result['suite_name']} task id ({tasks[names[0]]['episodes']} episodes each)")
    ax.set_ylabel("success rate")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))   # beside the bars, never over one
    ckpt = Path(result["checkpoint"])
    repeats = f" x{result['repeats']}" if result.get("repeats", 1) > 1 else ""
    limit = "" if result["standard_step_limit"] else " (NOT the suite limit)"
    ax.set_title(f"LIBERO {result['suite_name']}: {s['successes']}/{s['episodes']} = {s['success_rate']:.1%}\n"
                 f"{ckpt.parent.parent.name}/{ckpt.name} · {result['states']} states/task{repeats} · step limit "
                 f"{result['max_steps']}{limit} · {'greedy' if result.get('greedy') else 'sampled'} actions", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(result: dict) -> str:
    repeats = f" x{result['repeats']}" if result.get("repeats", 1) > 1 else ""
    lines = [f"LIBERO protocol  {result['suite_name']}  {result['states']} states/task{repeats}  step limit {result['max_steps']}"
             f"{'' if result['standard_step_limit'] else ' (NOT the suite limit)'}  settle {result['settle_steps']}  "
             f"{'greedy' if result.get('greedy') else 'sampled'} actions  "
             f"{result.get('arm_controller', 'OSC_POSE')}  "
             + "  ".join(f"{k} {v}" for k, v in result["versions"].items())
             + (f"\nLIBERO-PRO: {result['perturbation']['of']} with {result['perturbation']['changes']}"
                if result.get("perturbation") else ""),
             f"{'task':>4}  {'success':>9}  {'rate':>6}  {'95% Wilson':>13}  {'mean len':>8}  instruction"]
    for t, r in result["tasks"].items():
        lines.append(f"{t:>4}  {r['successes']:>4}/{r['episodes']:<4}  {r['success_rate']:>6.1%}  "
                     f"{r['wilson95'][0]:>5.3f}-{r['wilson95'][1]:<5.3f}  {r['mean_length']:>8.1f}  {r['instruction']}")
    s = result["suite"]
    lines.append(f"{'all':>4}  {s['successes']:>4}/{s['episodes']:<4}  {s['success_rate']:>6.1%}  "
                 f"{s['wilson95'][0]:>5.3f}-{s['wilson95'][1]:<5.3f}  {s['mean_length']:>8.1f}")
    lines.append(f"wall {result['wall_s']:.0f} s = {result['wall_s_per_episode']:.1f} s per episode "
                 f"({result['num_envs']} envs)" + (f"; {result['warning']}" if result["warning"] else ""))
    return "\n".join(lines)


def main(a, ckpt: Path, run_dir: Path) -> int:
    """The protocol run of parsed evaluate arguments `a` with the weights of `ckpt` (a.checkpoint,
    or the mean of the last --average-last checkpoints ending there; see rlvla3/tools/evaluate.py):
    env.suite's, or with --generalization env.suite's and its perturbations'."""
    if not a.generalization:
        result = run_suite(a, ckpt, run_dir, protocol_overrides(a.overrides))
        return result if isinstance(result, int) else 0
    return generalization(a, ckpt, run_dir)


def generalization(a, ckpt: Path, run_dir: Path) -> int:
    """The protocol over a standard suite and its LIBERO-PRO perturbations, one table."""
    from ..cluster.compose import compose
    from ..envs.hosting import check_env
    from ..envs.libero_env import PERTURBATIONS, PERTURBED

    overrides = protocol_overrides(a.overrides)
    base = compose(overrides).env.suite
    if base not in PERTURBED:
        raise SystemExit(f"--generalization: env.suite={base} has no LIBERO-PRO perturbations; use one of {', '.join(PERTURBED)}")
    keys = [k for k in a.perturbations.split(",") if k] if a.perturbations else list(PERTURBATIONS)
    bad = [k for k in keys if k not in PERTURBATIONS]
    if bad:
        raise SystemExit(f"--perturbations {a.perturbations}: {bad} not among {', '.join(PERTURBATIONS)}")
    rows = []
    for suite, what in [(base, "nothing: the standard suite"), *((f"{base}_{k}", PERTURBATIONS[k]) for k in keys)]:
        over = [*overrides, f"env.suite={suite}"]
        try:   # a perturbation whose files the installed package lacks (checked in LIBERO's interpreter)
            check_env(compose([*over, "env.init_states=fixed"]))
        except ValueError as e:
            rows.append({"suite": suite, "changes": what, "not_run": str(e)})
            continue
        result = run_suite(a, ckpt, run_dir / suite, over)
        if isinstance(result, int):
            return result
        rows.append({"suite": suite, "changes": what, **result["suite"]})
    table = {"checkpoint": a.checkpoint, "states": a.states, "repeats": a.repeats, "greedy": a.greedy, "suites": rows}
    (run_dir / "generalization.json").write_text(json.dumps(table, indent=1))
    print(generalization_report(table))
    print(run_dir / "generalization.json")
    return 0


def generalization_report(table: dict) -> str:
    lines = [f"LIBERO-PRO generalization  {table['checkpoint']}  {table['states']} states/task"
             f"{'  x' + str(table['repeats']) if table['repeats'] > 1 else ''}  "
             f"{'greedy' if table['greedy'] else 'sampled'} actions",
             f"{'suite':<26}  {'success':>9}  {'rate':>6}  {'95% Wilson':>13}  changes"]
    for r in table["suites"]:
        if "not_run" in r:
            lines.append(f"{r['suite']:<26}  {'not run':>9}  {'':>6}  {'':>13}  {r['changes']} ({r['not_run']})")
        else:
            lines.append(f"{r['suite']:<26}  {r['successes']:>4}/{r['episodes']:<4}  {r['success_rate']:>6.1%}  "
                         f"{r['wilson95'][0]:>5.3f}-{r['wilson95'][1]:<5.3f}  {r['changes']}")
    return "\n".join(lines)


def run_suite(a, ckpt: Path, run_dir: Path, overrides: list[str]) -> dict | int:
    """One suite's protocol run into `run_dir`: its result (also protocol.json), or the failed
    run's exit code."""
    from .. import config
    from ..cluster.compose import compose
    from ..cluster.local import run_local
    from ..envs.libero_env import MAX_STEPS, PERTURBATIONS, episode_of, perturbation_of
    from .episodes import eval_overrides
    from .videos import episode_videos

    cfg = compose(overrides)
    if cfg.env.name != "libero":
        raise SystemExit(f"--protocol libero: env.name={cfg.env.name!r}; the protocol runs env=libero")
    warning = refuse_trained_on_test_states(Path(a.checkpoint), cfg.env.suite, a.allow_train_states)
    check_repeats(a.repeats, a.states, a.greedy)
    tasks_given = any(o.startswith(("env.task_ids=", "++env.task_ids=")) for o in overrides)
    cfg = config.replace(cfg, seed=0, env=protocol_env(cfg, a.states, a.max_steps, tasks_given))
    want = len(cfg.env.task_ids) * a.states * a.repeats
    cfg = config.replace(cfg, **eval_overrides(cfg, str(ckpt.resolve()), want))
    facts = sim_facts(cfg)
    t0 = time.monotonic()
    proc = run_local(cfg, run_dir, timeout=a.timeout)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return proc.returncode
    table = tabulate(read_episodes(run_dir, cfg.algo.max_versions), list(cfg.env.task_ids), a.states * a.repeats)
    for t, r in table["tasks"].items():
        r["instruction"] = facts["tasks"][t]
    key = perturbation_of(cfg.env.suite)[1]
    result = {"protocol": "libero", "suite_name": cfg.env.suite, "checkpoint": a.checkpoint,
              "perturbation": {"of": perturbation_of(cfg.env.suite)[0], "key": key, "changes": PERTURBATIONS[key]} if key else None,
              "average_last": a.average_last, "states": a.states, "repeats": a.repeats,
              "max_steps": cfg.env.horizon, "standard_step_limit": cfg.env.horizon == MAX_STEPS[cfg.env.suite],
              "settle_steps": cfg.env.settle_steps, "image_size": cfg.env.image_size, "cameras": list(cfg.env.cameras),
              "fast_render": cfg.env.fast_render, "greedy": cfg.generator.greedy, "arm_controller": cfg.env.arm_controller,
              "versions": facts["versions"], "num_envs": cfg.env.num_envs,
              "wall_s": wall, "wall_s_per_episode": wall / want, "warning": warning, **table}
    (run_dir / "protocol.json").write_text(json.dumps(result, indent=1))
    plot(result, run_dir / "protocol.png")
    print(report(result))
    print(f"{run_dir / 'protocol.json'}  {run_dir / 'protocol.png'}")
    task_ids = list(cfg.env.task_ids)

    def task_of(seed: int) -> str:
        t = episode_of(seed, task_ids)[0]
        return f"task{t}-{facts['tasks'][t]}"

    episode_videos(run_dir, cfg.algo.max_versions, a.videos, task_of)
    return result

