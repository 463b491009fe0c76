"""`python -m analysis.curves RUN [RUN ...] [--evals DIR ...] [--versions N] --out PNG`: the
recipe's sample-efficiency plot for RL runs launched by hand, or stopped before their end.

Each run's history is its summary.json's or, for a run stopped early, rebuilt from its metrics
(`read_history`), or its newest checkpoint's where that holds more versions (a run stopped before
a version's metrics were written out). Runs are grouped by mode; async with a staleness bound other than 1 is its own
group ("async eta=0"). Each evaluation folder (`python -m rlvla3.evaluate --out DIR`) is drawn at
the version of the checkpoint it evaluated, on the run that wrote it; one that evaluated the runs'
warm start (`policy.init_from`) is the SFT band. Prints every run's numbers and each group's
training success by quarter of the first N versions (default: the shortest run's), pooled over
its runs: equal versions are equal episodes in every mode. The figure is the recipe's
(`rlvla3.tools.recipe.plot`), drawn with plain-number axes (no `1e6` offset on the env-step axis)
and titled with the runs, their modes and the commit that drew it.

    python -m analysis.curves runs/r/rl-sync-seed0 runs/r/rl-async-seed0 --evals runs/r/eval-sft --out curves.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from analysis.figures import drawn_by, plain_ticks, run_name
from rlvla3.engine.checkpoints import all_ckpts, ckpt_order, load_torch
from rlvla3.engine.metrics import read_history, steady_throughput
from rlvla3.tools.recipe import evaluation_result, plot, success_by_quarter


def run_config(folder: Path) -> dict:
    f = folder / "config.yaml"
    if not f.is_file():
        raise SystemExit(f"{folder}: no config.yaml; give run folders (hydra.run.dir) and evaluation folders (--out)")
    return yaml.safe_load(f.read_text())


def group_of(cfg: dict) -> str:
    mode = cfg["mode"]
    return mode["name"] if mode["name"] != "async" or mode.get("eta", 1) == 1 else f"async eta={mode['eta']}"


def run_history(folder: Path) -> list[dict]:
    """read_history, or the newest checkpoint's history where it holds more versions."""
    history, ckpts = read_history(folder), all_ckpts(folder / "ckpt")
    if ckpts and ckpt_order(ckpts[-1])[0] > len(history):
        saved = json.loads(load_torch(ckpts[-1], mmap=True)["history"])
        if len(saved) > len(history):
            print(f"{folder.name}: metrics hold {len(history)} versions, {ckpts[-1].name} {len(saved)}: using the checkpoint's")
            return saved
    return history


def load_run(folder: Path) -> dict:
    cfg, history = run_config(folder), run_history(folder)
    if not history:
        raise SystemExit(f"{folder}: no trained version recorded (metrics/ holds no Trainer scalars)")
    return {"folder": folder.resolve(), "mode": group_of(cfg), "seed": cfg["seed"], "history": history,
            "init_from": str(Path(cfg["policy"]["init_from"]).resolve()) if cfg["policy"].get("init_from") else ""}


def first_versions(run: dict, n: int) -> dict:
    """`run` cut to its first `n` versions, with the env steps and wall time they took."""
    history = run["history"][:n]
    return {**run, "history": history, "env_steps": int(sum(h["env_steps"] for h in history)), "wall_s": history[-1]["t"]}


def attach_evaluations(runs: list[dict], evals: list[Path]) -> dict | None:
    """Give each run the evaluation of its own checkpoint (the newest if several); return the
    evaluation of the runs' warm start, if one was given."""
    sft = None
    for folder in evals:
        ckpt = Path(run_config(folder)["policy"]["init_from"]).resolve()
        result = evaluation_result(folder)
        owner = [r for r in runs if ckpt.parent.parent == r["folder"]]
        if owner:
            version = ckpt_order(ckpt)[0]
            if version > owner[0].get("eval_version", -1):
                owner[0].update(eval=result, eval_version=version)
        elif any(str(ckpt) == r["init_from"] for r in runs):
            sft = result
        else:
            raise SystemExit(f"{folder} evaluated {ckpt}: neither a checkpoint of the runs given nor their warm start")
    return sft


def compare(runs: list[dict], sft: dict | None, n: int) -> dict:
    """The plot's numbers: the runs (cut to n versions), the SFT evaluation, each group's success
    by quarter pooled over its seeds."""
    groups = {r["mode"]: [x for x in runs if x["mode"] == r["mode"]] for r in runs}
    return {"sft_eval": sft, "versions": n, "rl": runs,
            "modes": {g: {"seeds": [r["seed"] for r in rs],
                          "training_success_by_quarter": success_by_quarter([r["history"] for r in rs])}
                      for g, rs in groups.items()}}


def title_of(runs: list[dict], n: int) -> str:
    """Which runs (their folders; a common parent once there are many), modes, versions, commit."""
    names = [run_name(r["folder"]) for r in runs]
    parents = {r["folder"].parent for r in runs}
    which = ", ".join(names) if len(names) <= 4 else f"{len(names)} runs under {', '.join(sorted(p.name for p in parents))}"
    return f"{which} · modes {', '.join(dict.fromkeys(r['mode'] for r in runs))} · first {n} versions · {drawn_by()}"


def draw(result: dict, out: Path, title: str):
    """The recipe's figure, saved to `out` again with plain-number axes (its env-step axes get a
    `1e6` offset) and `title` above its own caption; returned open (the caller closes it)."""
    import matplotlib.pyplot as plt

    plot(result, out)
    fig = plt.gcf()   # recipe.plot leaves its figure open as pyplot's current one
    if not fig.axes:  # should it ever close it: keep the file it saved
        return fig
    for ax in fig.axes:
        plain_ticks(ax.xaxis)
    fig.suptitle(f"{title}\n{fig.get_suptitle()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return fig


def main(argv: list[str] | None = None) -> int:
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser(prog="python -m analysis.curves", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="RL run folders")
    ap.add_argument("--evals", nargs="*", type=Path, default=[], help="evaluation folders of the runs' checkpoints or warm start")
    ap.add_argument("--versions", type=int, default=0, help="compare the first N versions (default: the shortest run's)")
    ap.add_argument("--out", type=Path, required=True, help="the plot (.png); the numbers go beside it as .json")
    a = ap.parse_args(argv)
    runs = [load_run(f) for f in a.runs]
    n = a.versions or min(len(r["history"]) for r in runs)
    short = [str(r["folder"]) for r in runs if len(r["history"]) < n]
    if short:
        raise SystemExit(f"--versions={n}: these runs have fewer: {', '.join(short)}")
    runs = [first_versions(r, n) for r in runs]
    sft = attach_evaluations(runs, a.evals)
    result = compare(runs, sft, n)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    plt.close(draw(result, a.out, title_of(runs, n)))
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    print(f"first {n} versions of each run")
    for r in runs:
        e = r.get("eval")
        held_out = (f"; held out at v{r['eval_version']}: {e['successes']}/{e['episodes']} = {e['success_rate']:.3f} "
                    f"[{e['wilson95'][0]:.3f}, {e['wilson95'][1]:.3f}]") if e else ""
        print(f"{r['mode']:12s} seed {r['seed']}: {r['env_steps']} env steps in {r['wall_s']:.0f} s, "
              f"{steady_throughput(r['history']):.1f} env steps/s{held_out}  ({r['folder'].name})")
    if sft:
        print(f"SFT held out: {sft['successes']}/{sft['episodes']} = {sft['success_rate']:.3f} "
              f"[{sft['wilson95'][0]:.3f}, {sft['wilson95'][1]:.3f}]")
    for g, m in result["modes"].items():
        print(f"{g:12s} seeds {m['seeds']} by quarter: " + "  ".join(
            f"v{q['versions'][0]}-{q['versions'][1]} {round(q['success'] * q['episodes'])}/{q['episodes']} = "
            f"{q['success']:.3f} [{q['wilson95'][0]:.3f}, {q['wilson95'][1]:.3f}]" for q in m["training_success_by_quarter"]))
    print(f"plot {a.out}; numbers {a.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
