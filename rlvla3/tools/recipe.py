"""`python -m rlvla3.recipe [--out DIR] [options] [overrides...]`: the warm-start recipe in one
command, sync and async side by side.

    1. expert demonstrations          python -m rlvla3.collect
    2. SFT warm start                 python -m rlvla3.sft
    3. evaluate the SFT checkpoint    python -m rlvla3.evaluate (held-out seeds, Wilson interval;
                                      LIBERO: its protocol on the fixed states, held out from training)
    4. RL from it, mode=sync and mode=async (and each --seeds), the same settings otherwise
    5. evaluate every final checkpoint the same way

Writes `recipe.json` (every number) and `recipe.png`: training success vs env steps (sample
efficiency) and vs wall time (throughput) for every run, with the evaluations as intervals.
Each step is the same command a user would run by hand; the overrides pick env and policy.

    python -m rlvla3.recipe +experiment=toy --out runs/recipe-toy
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

from ..engine.checkpoints import all_ckpts
from ..engine.metrics import read_history

STAGE_TIMEOUT = 3 * 3600.0   # s; each stage also bounds its own waits (runtime.*, --timeout)


def step(args: list[str], log: Path) -> None:
    """Run one stage as its own command; its output goes to `log`; a failure stops the recipe."""
    t0 = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, "-m", *args], stdout=f, stderr=subprocess.STDOUT,
                                timeout=STAGE_TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{args[0]} did not finish within {STAGE_TIMEOUT:.0f}s; see {log}") from None
    print(f"  {args[0]:16s} {time.time() - t0:6.0f}s  (log {log})", flush=True)
    if rc != 0:
        raise SystemExit(f"{' '.join(args[:1])} failed (exit {rc}); see {log}")


def evaluate(ckpt: Path, out: Path, a, overrides: list[str], cfg) -> dict:
    """Success rate, Wilson interval and episodes of `ckpt` on held-out initial states: fresh
    seeds, or on LIBERO its protocol (the suite's fixed states, which training never sees). With
    --resume an evaluation of as many episodes is kept (another count is run again)."""
    args, result, episodes = eval_args(a, cfg)
    kept = a.resume and (out / result).is_file() and episodes_of(json.loads((out / result).read_text())) == episodes
    if not kept:
        shutil.rmtree(out, ignore_errors=True)   # a partial evaluation starts over
        step(["rlvla3.evaluate", "--checkpoint", str(ckpt), *args, "--out", str(out), *overrides,
              "runtime.tensorboard=false"], out.with_suffix(".log"))
    return evaluation_result(out)


def evaluation_result(folder: Path) -> dict:
    """The success rate, Wilson interval and episodes an evaluation folder holds (LIBERO: its
    protocol's whole suite)."""
    if (folder / "protocol.json").is_file():
        return json.loads((folder / "protocol.json").read_text())["suite"]
    return json.loads((folder / "eval.json").read_text())


def episodes_of(result: dict) -> int:
    return result["suite"]["episodes"] if "suite" in result else result["episodes"]


def eval_args(a, cfg) -> tuple[list[str], str, int]:
    """The evaluate arguments for --eval-episodes, the file its result is in, and how many
    episodes it runs (whole rounds of env.num_envs: evaluate's rounding). LIBERO: the
    protocol on --eval-episodes / tasks fixed states of each of the run's tasks; beyond the 50
    states, a multiple of 50 a task visits each state that many times (--repeats)."""
    if cfg.env.name != "libero":
        from .episodes import eval_rounds

        return ["--episodes", str(a.eval_episodes)], "eval.json", eval_rounds(cfg, a.eval_episodes) * cfg.env.num_envs
    from ..envs.libero_env import FIXED_STATES

    tasks = list(cfg.env.task_ids)
    per_task = max(1, a.eval_episodes // len(tasks))
    if per_task > FIXED_STATES and per_task % FIXED_STATES:
        raise SystemExit(f"--eval-episodes={a.eval_episodes}: {per_task} a task is more than LIBERO's {FIXED_STATES} fixed "
                         f"states; use a multiple of {FIXED_STATES} a task (each state repeated)")
    states, repeats = min(per_task, FIXED_STATES), max(1, per_task // FIXED_STATES)
    return ["--protocol", "libero", "--states", str(states), "--repeats", str(repeats),
            f"env.task_ids=[{','.join(map(str, tasks))}]"], "protocol.json", len(tasks) * states * repeats


def rl_runs(a, cfg) -> list[tuple[str, int]]:
    """(mode, seed) of every RL stage: each mode once per seed; a bad mode or seed stops here."""
    try:
        seeds = [int(x) for x in a.seeds.split(",") if x.strip()] if a.seeds.strip() else [int(cfg.seed)]
    except ValueError:
        raise SystemExit(f"--seeds={a.seeds!r}: give whole numbers separated by commas, e.g. --seeds 0,1") from None
    modes = [mode for mode in a.modes.split(",") if mode]
    from ..cluster.compose import CONF_DIR

    known = sorted(f.stem for f in (CONF_DIR / "mode").glob("*.yaml"))
    for mode in modes:
        if mode not in known:   # found here, not after collection and SFT have run
            raise SystemExit(f"--modes={a.modes!r}: no mode {mode!r}; choose from {','.join(known)} (comma-separated)")
    return [(mode, seed) for mode in modes for seed in seeds]


def run_name(r: dict) -> str:
    return f"{r['mode']} seed {r['seed']}"


def rl_stage(out: Path, mode: str, seed: int, a, ov: list[str], cfg) -> dict:
    """One RL run from the recipe's SFT checkpoint and the evaluation of its last checkpoint."""
    run, evaluation = out / f"rl-{mode}-seed{seed}", out / f"eval-{mode}-seed{seed}"
    if a.resume and finished_run(run, a.versions):
        print(f"  {mode} seed {seed}: kept {run}", flush=True)
    else:
        for stale in (run, evaluation):   # an interrupted stage starts over
            shutil.rmtree(stale, ignore_errors=True)
        step(["rlvla3.launch", *ov, f"mode={mode}", f"seed={seed}", f"policy.init_from={(out / 'sft.pt').resolve()}",
              f"algo.max_versions={a.versions}", "runtime.tensorboard=false", f"hydra.run.dir={run}"],
             run.with_suffix(".log"))
    ckpt = all_ckpts(run / "ckpt")[-1]
    history = read_history(run)
    return {"mode": mode, "seed": seed, "history": history, "wall_s": history[-1]["t"],
            "env_steps": sum(h["env_steps"] for h in history), "eval": evaluate(ckpt, evaluation, a, ov, cfg)}


def mode_summaries(runs: list[dict]) -> dict:
    """Per mode over its seeds: the mean held-out success, the training throughput, the share of
    rows trained off-policy (produced by an older version), and training success by quarter of the
    versions (sample efficiency, compared across modes at equal samples)."""
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        rs = [r for r in runs if r["mode"] == mode]
        out[mode] = {"seeds": [r["seed"] for r in rs],
                     "mean_success": sum(r["eval"]["success_rate"] for r in rs) / len(rs),
                     "env_steps_per_s": sum(r["env_steps"] for r in rs) / sum(r["wall_s"] for r in rs),
                     "stale_share": stale_share(rs),
                     "training_success_by_quarter": success_by_quarter([r["history"] for r in rs])}
    return out


def stale_share(runs: list[dict]) -> float:
    """Mean share of rows trained off-policy over every version of `runs` (NaN for runs kept
    from before histories recorded it)."""
    shares = [h["stale_share"] for r in runs for h in r["history"] if "stale_share" in h]
    return mean(shares) if shares else float("nan")


def success_by_quarter(histories: list[list[dict]]) -> list[dict]:
    """Training success over each quarter of the versions every run reached (fewer parts for fewer
    versions), the episodes of all runs pooled, with its Wilson interval and the runs' mean env
    steps at the quarter's middle: a version is a fixed number of episodes, so equal quarters are
    equal samples in every mode."""
    from .episodes import wilson

    n = min(len(h) for h in histories)
    k = min(4, n)
    parts = []
    for q in range(k):
        lo, hi = q * n // k, (q + 1) * n // k
        versions = [v for h in histories for v in h[lo:hi]]
        episodes = sum(v["episodes"] for v in versions)
        successes = round(sum(v["success"] * v["episodes"] for v in versions))
        middle = [sum(v["env_steps"] for v in h[:lo]) + sum(v["env_steps"] for v in h[lo:hi]) / 2 for h in histories]
        parts.append({"versions": [versions[0]["version"], versions[-1]["version"]], "episodes": episodes,
                      "success": successes / episodes if episodes else float("nan"),
                      "wilson95": list(wilson(successes, episodes)), "env_steps": sum(middle) / len(middle)})
    return parts


def finished_run(run: Path, versions: int) -> bool:
    """An RL stage that trained all its versions (--resume keeps it; a partial one is redone)."""
    f = run / "summary.json"
    return f.is_file() and len(json.loads(f.read_text())["history"]) >= versions


SMOOTH = 5   # versions per point of the training curves: a grpo version holds only a few initial states


def smoothed_success(history: list[dict], window: int) -> list[float]:
    """Success rate over the episodes of the last `window` versions, at each version."""
    out = []
    for i in range(len(history)):
        h = history[max(0, i - window + 1):i + 1]
        eps = sum(x["episodes"] for x in h)
        out.append(sum(x["success"] * x["episodes"] for x in h) / eps if eps else float("nan"))
    return out


def plot(result: dict, path: Path) -> None:
    """Training success vs env steps and vs wall time for every run (squares: held-out evaluations
    of the checkpoint each run's `eval` names, at that version), and each group's training success
    by quarter pooled over its seeds. A run's group is its `mode` (the recipe's modes, or
    analysis.curves' labels); `eval` and `sft_eval` may be absent (runs evaluated by no one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4), sharey=True)
    colors = dict(zip(result["modes"], ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"] * 9))
    seeds = sorted({r["seed"] for r in result["rl"]})
    styles = dict(zip(seeds, ["-", "--", ":", "-."] * len(seeds)))
    for r in result["rl"]:
        h, color, style = r["history"], colors[r["mode"]], styles[r["seed"]]
        steps = [sum(x["env_steps"] for x in h[:i + 1]) for i in range(len(h))]
        succ = smoothed_success(h, SMOOTH)
        axes[0].plot(steps, succ, style, color=color, label=f"{run_name(r)} (training episodes, last {SMOOTH} versions)")
        axes[1].plot([x["t"] for x in h], succ, style, color=color, label=run_name(r))
        if r.get("eval"):
            e, at = r["eval"], min(r.get("eval_version", len(h)), len(h)) - 1
            lo, hi = e["wilson95"]
            for ax, x in ((axes[0], steps[at]), (axes[1], h[at]["t"])):
                ax.errorbar([x], [e["success_rate"]], yerr=[[e["success_rate"] - lo], [hi - e["success_rate"]]],
                            fmt="s", color=color, capsize=4)
    for mode, m in result["modes"].items():   # sample efficiency: each group's seeds pooled
        qs = m["training_success_by_quarter"]
        axes[2].errorbar([q["env_steps"] for q in qs], [q["success"] for q in qs], fmt="o-", color=colors[mode], capsize=4,
                         yerr=[[q["success"] - q["wilson95"][0] for q in qs], [q["wilson95"][1] - q["success"] for q in qs]],
                         label=f"{mode}, seeds {m['seeds']} pooled (95% Wilson)")
    for ax in axes:
        if result.get("sft_eval"):
            lo, hi = result["sft_eval"]["wilson95"]
            ax.axhspan(lo, hi, color="gray", alpha=0.25, label="SFT evaluation (95% Wilson)")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("wall time (s)")
    axes[2].set_xlabel("env steps (training success by quarter of the versions)")
    axes[0].set_ylabel("success rate")
    axes[0].legend(loc="upper left", fontsize=8)   # curves rise to the right: the top left stays free
    axes[2].legend(loc="upper left", fontsize=8)
    fig.suptitle("SFT warm start, then RL: squares = held-out evaluations of the checkpoints")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.recipe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="folder for everything (default runs/recipe/<date>-<time>)")
    ap.add_argument("--demo-episodes", type=int, default=16, help="expert episodes to collect (at least)")
    ap.add_argument("--sft-steps", type=int, default=40, help="SFT optimizer steps (few: a modest warm start)")
    ap.add_argument("--sft-lr-decay", action="store_true", help="SFT's learning rate decays linearly to 0 (sft --lr-decay)")
    ap.add_argument("--sft-shift", type=int, default=0, help="SFT's random-shift augmentation in pixels (sft --shift)")
    ap.add_argument("--sft-state-dropout", type=float, default=0.0,
                    help="share of SFT's rows trained without the state (sft --state-dropout)")
    ap.add_argument("--versions", type=int, default=20, help="RL versions per mode")
    ap.add_argument("--eval-episodes", type=int, default=208,
                    help="evaluation episodes per checkpoint (LIBERO: the protocol's fixed states; beyond 50 a task, "
                         "a multiple of 50 repeats each state)")
    ap.add_argument("--modes", default="sync,async", help="RL modes to run ('': demos, SFT and its evaluation only)")
    ap.add_argument("--seeds", default="",
                    help="RL seeds, comma-separated: each mode runs once per seed from the same SFT checkpoint "
                         "(default: the config's seed)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the stages --out already holds (demos, sft.pt, evaluations, finished RL runs)")
    ap.add_argument("overrides", nargs="*", help="config overrides for every stage (env, policy, ...)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_intermixed_args(argv)
    out = Path(a.out or f"runs/recipe/{time.strftime('%Y-%m-%d-%H-%M-%S')}")
    out.mkdir(parents=True, exist_ok=True)
    ov = list(a.overrides)
    from ..cluster.compose import compose

    cfg = compose(ov)   # bad overrides stop here, before any stage runs
    runs = rl_runs(a, cfg)
    t0 = time.time()
    print(f"recipe in {out}:", flush=True)
    if not (a.resume and any((out / "demos" / "shards").glob("s*"))):
        step(["rlvla3.collect", "--episodes", str(a.demo_episodes), "--out", str(out / "demos"), *ov], out / "collect.log")
    if not (a.resume and (out / "sft.pt").is_file()):
        step(["rlvla3.sft", "--demos", str(out / "demos"), "--steps", str(a.sft_steps),
              *(["--lr-decay"] if a.sft_lr_decay else []), "--shift", str(a.sft_shift),
              "--state-dropout", str(a.sft_state_dropout), "--out", str(out / "sft.pt"), *ov],
             out / "sft.log")
    result = {"overrides": ov, "sft_eval": evaluate(out / "sft.pt", out / "eval-sft", a, ov, cfg), "rl": []}
    for mode, seed in runs:
        result["rl"].append(rl_stage(out, mode, seed, a, ov, cfg))
    result["modes"] = mode_summaries(result["rl"])
    result["wall_s"] = time.time() - t0
    (out / "recipe.json").write_text(json.dumps(result, indent=1))
    plot(result, out / "recipe.png")
    e = result["sft_eval"]
    print(f"\nSFT            success {e['success_rate']:.3f}  95% [{e['wilson95'][0]:.3f}, {e['wilson95'][1]:.3f}]  "
          f"({e['episodes']} held-out episodes)")
    for r in result["rl"]:
        e = r["eval"]
        print(f"RL {run_name(r):15s} success {e['success_rate']:.3f}  95% [{e['wilson95'][0]:.3f}, {e['wilson95'][1]:.3f}]  "
              f"after {r['env_steps']} env steps in {r['wall_s']:.0f}s of training")
    for mode, m in result["modes"].items():
        print(f"{mode:6s} mean success {m['mean_success']:.3f} over seeds {m['seeds']}; "
              f"{m['env_steps_per_s']:.1f} env steps/s of training; {m['stale_share']:.0%} of rows trained off-policy")
        print(f"{mode:6s} training success by quarter of the versions (seeds pooled): " + "  ".join(
            f"v{q['versions'][0]}-{q['versions'][1]} {q['success']:.3f} [{q['wilson95'][0]:.3f}, {q['wilson95'][1]:.3f}]"
            for q in m["training_success_by_quarter"]))
    print(f"total {result['wall_s']:.0f}s; plot {out / 'recipe.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
