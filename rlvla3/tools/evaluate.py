"""`python -m rlvla3.evaluate --checkpoint CKPT [--episodes N] [--seed S] [overrides...]`:
success rate of a policy checkpoint over the real engine, without training.

The run is the engine as usual (Simulators, Generators, the Trainer counting rows) with
`runtime.evaluate=true`: no optimizer step, and every segment is exactly one whole episode of each
env, reset from its own seed. Counting whole episodes only (never "episodes finished before the
stop") keeps short, successful episodes from being over-counted. Seeds: episode seeds derive from
`--seed` (default 1000003), not the training seed 0, so evaluation states are held out.
Actions are sampled from the policy, as in training.

Prints successes / episodes with a 95% Wilson score interval and writes `eval.json` in the run
folder. `--protocol libero` runs LIBERO's standard evaluation instead (tools/libero_protocol.py).
`--of-run RUN` is the evaluation a training run's Trainer 0 starts while it trains
(runtime.eval_every, engine/evaluator.py): RUN's own config, all roles in this process.
`--average-last N` evaluates the mean weights of the N checkpoints of the run that end
at CKPT (a run whose consecutive versions differ a lot is better judged by their average than by
whichever version came last).
"""
from __future__ import annotations

import argparse
import json
import sys
import zipfile
from datetime import datetime
from pathlib import Path

from .episodes import count, eval_overrides, wilson


def average_checkpoints(last: Path, n: int, out: Path) -> Path:
    """Write to `out` a checkpoint whose model weights are the mean of the `n` version-end
    checkpoints of `last`'s folder up to and including `last` (a run's ckpt/v*.pt or v*.dcp; a
    preemption's mid-version checkpoint, v*-s*, is not a version of its own)."""
    import torch

    from ..engine.checkpoints import all_ckpts, ckpt_order, read

    version, mid = ckpt_order(last)
    if version < 0 or mid:
        raise SystemExit(f"--average-last needs a run's version-end checkpoint (ckpt/vNNNNNN.pt or .dcp); {last} is not one")
    run = [p for p in all_ckpts(last.parent) if ckpt_order(p)[1] == 0 and ckpt_order(p)[0] <= version]
    chosen = run[-n:]
    if len(chosen) < n:
        raise SystemExit(f"--average-last {n}: {last.parent} holds only {len(chosen)} checkpoints up to {last.name} "
                         f"(a run keeps its newest runtime.keep_ckpts; train with runtime.keep_ckpts={n} or more "
                         f"to average its last {n})")
    states = [read(p) for p in chosen]
    models = [s["model"] for s in states]
    mean = {k: torch.stack([m[k].double() for m in models]).mean(0).to(models[0][k].dtype) for k in models[0]}
    out.parent.mkdir(parents=True, exist_ok=True)
    frozen = {"frozen": states[-1]["frozen"]} if "frozen" in states[-1] else {}   # a LoRA run's: the same base
    torch.save({"model": mean, "averaged": [p.name for p in chosen], **frozen}, out)
    return out


def of_run_config(run: Path, ckpt: Path, episodes: int, seed: int):
    """The evaluation a training run's Trainer 0 asks for (runtime.eval_every): the run's own env
    and policy (its config.yaml) from `ckpt`, on runtime.eval_envs envs of one Simulator with one
    Generator and one Trainer, episode seeds from `seed`; its ranks log nothing to TensorBoard or
    W&B (the training run's Trainer does) and start no evaluation of their own."""
    from .. import config

    cfg = config.load(run)
    cfg = config.replace(cfg, seed=seed, resume=False, env={"num_envs": cfg.runtime.eval_envs},
                         cluster={"sim_ranks": 1, "gen_ranks": 1, "train_ranks": 1},
                         sharding={"plan": [], "groups_per_rank": 1},
                         runtime={"eval_every": 0, "tensorboard": False, "wandb": False, "progress": False})
    return config.replace(cfg, **eval_overrides(cfg, str(ckpt), episodes))


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a .pt checkpoint (run ckpt/ or rlvla3.sft output)")
    ap.add_argument("--episodes", type=int, default=200, help="episodes (rounded up to whole rounds of env.num_envs)")
    ap.add_argument("--seed", type=int, default=1_000_003, help="episode seeds derive from this (held out from training)")
    ap.add_argument("--average-last", type=int, default=1,
                    help="evaluate the mean weights of the last N run checkpoints ending at --checkpoint")
    ap.add_argument("--out", default="", help="run folder (default runs/eval/<date>-<time>)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for the whole run")
    ap.add_argument("--protocol", choices=["libero"], default=None,
                    help="libero: every task of env.suite x --states fixed initial states (rlvla3/tools/libero_protocol.py)")
    ap.add_argument("--states", type=int, default=50, help="--protocol libero: fixed initial states per task")
    ap.add_argument("--repeats", type=int, default=1,
                    help="--protocol libero: episodes per fixed state (> 1: all 50 states, sampled actions)")
    ap.add_argument("--max-steps", type=int, default=0, help="--protocol libero: step limit (default: the suite's)")
    ap.add_argument("--allow-train-states", action="store_true",
                    help="--protocol libero: evaluate a checkpoint trained on the fixed states (not held out)")
    ap.add_argument("--generalization", action="store_true",
                    help="--protocol libero: env.suite and each of its LIBERO-PRO perturbations, one table")
    ap.add_argument("--perturbations", default="",
                    help="--generalization: comma-separated perturbations (default all: lan,object,swap,task,env)")
    ap.add_argument("--videos", type=int, default=2, help="mp4 of the first N episodes of each task (0: none)")
    ap.add_argument("--lerobot", action="store_true", help="also write the episodes as a LeRobotDataset v3.0 in <out>/lerobot")
    ap.add_argument("--of-run", default="", metavar="RUN",
                    help="evaluate for a training run (what its Trainer 0 starts with runtime.eval_every): RUN's own "
                         "config, runtime.eval_envs envs, every role in this process, videos into RUN's TensorBoard")
    ap.add_argument("--greedy", action="store_true",
                    help="act on the most likely action instead of sampling (generator.greedy: token argmax, as "
                         "OpenVLA is evaluated; a Gaussian's mean; a chain without injected noise)")
    ap.add_argument("overrides", nargs="*", help="config overrides: the trained run's env and policy")
    return ap


def refuse_bad_flags(a) -> None:
    """Flags that contradict each other, named before anything runs."""
    if a.episodes < 1:
        raise SystemExit(f"--episodes={a.episodes}: must be >= 1")
    if a.repeats != 1 and a.protocol != "libero":
        raise SystemExit(f"--repeats={a.repeats}: repeats fixed initial states, which only --protocol libero has; "
                         "use --episodes for more episodes")
    if (a.generalization or a.perturbations) and a.protocol != "libero":
        raise SystemExit("--generalization/--perturbations run LIBERO-PRO's suites: add --protocol libero")
    if a.perturbations and not a.generalization:
        raise SystemExit(f"--perturbations {a.perturbations}: name the suites of a --generalization run "
                         "(or give env.suite=<suite>_<perturbation>)")


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_intermixed_args(argv)
    if a.greedy:
        a.overrides.append("generator.greedy=true")
    from .. import config
    from ..cluster.compose import compose
    from ..cluster.local import run_local
    from ..engine.checkpoints import CheckpointError, ckpt_order, exists, read

    refuse_bad_flags(a)
    if not exists(a.checkpoint):
        raise SystemExit(f"--checkpoint {a.checkpoint}: no such checkpoint (a file, or a sharded run's vNNNNNN.dcp folder)")
    try:   # before any rank starts: memory-mapped, so a large checkpoint costs little here
        read(a.checkpoint, mmap=zipfile.is_zipfile(a.checkpoint))   # (only torch's zip format maps; not a folder)
    except CheckpointError as e:
        raise SystemExit(f"--checkpoint {e}") from None
    if a.average_last < 1:
        raise SystemExit(f"--average-last={a.average_last}: must be >= 1")
    run_dir = Path(a.out or f"runs/eval/{datetime.now():%Y-%m-%d-%H-%M-%S}")
    ckpt = Path(a.checkpoint)
    if a.average_last > 1:
        ckpt = average_checkpoints(ckpt, a.average_last, run_dir.with_name(run_dir.name + "-averaged.pt"))
    if a.protocol == "libero":
        from .libero_protocol import main as libero_protocol

        return libero_protocol(a, ckpt, run_dir)
    of_run = Path(a.of_run) if a.of_run else None
    if of_run is not None:
        from ..engine.inprocess import InProcessRun

        cfg = of_run_config(of_run, ckpt.resolve(), a.episodes, a.seed)
        cfg = config.replace(cfg, generator={"greedy": a.greedy})
        InProcessRun(cfg, run_dir).run(a.timeout)
    else:
        cfg = compose(a.overrides)
        cfg = config.replace(cfg, seed=a.seed, **eval_overrides(cfg, str(ckpt.resolve()), a.episodes))
        proc = run_local(cfg, run_dir, timeout=a.timeout)
        if proc.returncode != 0:
            return proc.returncode
    succ, eps = count(run_dir, cfg.algo.max_versions)
    lo, hi = wilson(succ, eps)
    result = {"checkpoint": a.checkpoint, "average_last": a.average_last, "episodes": eps, "successes": succ,
              "success_rate": succ / max(eps, 1), "wilson95": [lo, hi], "seed": a.seed,
              "greedy": cfg.generator.greedy}
    (run_dir / "eval.json").write_text(json.dumps(result, indent=1))
    print(f"success {succ}/{eps} = {succ / max(eps, 1):.3f}  (95% Wilson interval {lo:.3f}-{hi:.3f})  {run_dir}")
    task = cfg.env.name if cfg.env.name in ("toy", "emulated") else cfg.env.task   # (env.task: the robosuite/metaworld one)
    from .videos import episode_videos

    episode_videos(run_dir, cfg.algo.max_versions, a.videos, lambda seed: task, of_run, ckpt_order(ckpt)[0])
    if a.lerobot:
        from .lerobot_dataset import export_lerobot

        print(export_lerobot(run_dir, cfg, cfg.algo.max_versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
