"""`python -m rlvla3.plan show|ladder --profile conf/profile/X.yaml --gpus G`   (show --gpus 8..256: the scaling curve)
   `python -m rlvla3.plan profile <run folder> [--profile out.yaml]`
   `python -m rlvla3.plan validate [--profile P] [--ranks 8,16,32] [--modes sync,async]`

    profile measure a planner profile from a finished run folder (rlvla3/planner/measure.py)

    show    the planned layout for G GPUs (planner/search.py: analytic search, DES check), beside
            the best sync baseline and the naive 1:1 split; `--write conf/cluster/planned_G.yaml`
            writes it as a cluster config the launcher accepts (`cluster=planned_G`).
    ladder  the models' predicted ablation ladder (sync colocated -> ... -> +streaming) beside
            the paper's published LIBERO + pi0.5 rows at 32 GPUs.
    validate  the models against the engine: predicted vs measured env steps/s for layouts of N
            ranks, the engine running emulated costs of the profile (rlvla3/planner/validate.py).

show and ladder print model predictions from the profile; validate also measures the engine.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..cluster.compose import CONF_DIR
from .analytic import Estimate, analytic
from .des import simulate
from .layout import layout_sharding
from .overrides import overrides, overrides_yaml
from .profile import PlannerError, Profile, load_profile, require, save_profile
from .search import CPU_CORES_PER_GPU, DES_CHECKS, Proposal, Scored, env_budget, ladder_layouts, propose

# Published v1 ablation ladder, LIBERO + pi0.5, 32 GPUs, env steps/s. SECONDARY transcriptions
# ([S] in the project notes on the paper's numbers): likely but not verified from the PDF.
PAPER_GPUS = 32
PAPER_LIBERO_PI05 = {
    "colocated, sync": 703.85,
    "disaggregated 1:1, sync": 457.23,
    "+ train async (overlap)": 737.46,
    "+ rollout async (dynamic batching)": 1041.36,
    "+ streamer (streaming micro-batches)": 1120.91,
}


def _util(e: Estimate) -> str:
    u = e.utilization
    return f"sim {u['sim']:.2f} gen {u['generator']:.2f} train {u['trainer']:.2f}"


def _row(label: str, s: Scored, profile: Profile) -> str:
    lay = s.layout
    sims = len(layout_sharding(profile, lay))
    des = f"{s.des.steps_per_s:9.1f}" if s.des is not None else f"{'-':>9s}"
    t_max = f"{lay.t_max_ms:g}" if lay.env_level else "-"
    return (f"{label:22s} {lay.gen_gpus:4d} {lay.train_gpus:5d} {lay.placement[:5]:6s} {sims:4d} {lay.num_envs:6d} "
            f"{lay.envs_per_gen:7d} {lay.group_size:5d} {lay.b_max:5d} {t_max:>6s} {lay.eta:3d} "
            f"{s.analytic.steps_per_s:9.1f} {des} {s.analytic.bottleneck:9s} {_util(s.des or s.analytic)}")


HEADER = (f"{'layout':22s} {'gen':>4s} {'train':>5s} {'place':6s} {'sims':>4s} {'envs':>6s} {'env/gen':>7s} "
          f"{'group':>5s} {'B_max':>5s} {'T_max':>6s} {'eta':>3s} {'analytic':>9s} {'DES':>9s} {'bound':9s} "
          f"utilization")


def show_text(plan: Proposal) -> str:
    """The plan as a table: planned, DES-checked alternatives, sync baselines, naive 1:1."""
    prof = plan.profile
    best = plan.best
    rows = [f"profile {prof.name}: {plan.gpus} GPUs, {plan.cpu_cores} CPU cores "
            f"({env_budget(prof, plan.cpu_cores)} envs at most); {plan.candidates} layouts scored, "
            f"{len(plan.checked)} checked with the DES; steps/s are model predictions", HEADER,
            _row("PLANNED async", best, prof)]
    rows += [_row("  (DES-checked alt)", s, prof) for s in plan.checked[1:]]
    rows += [_row("sync colocated", plan.sync_colocated, prof), _row("sync disaggregated", plan.sync_disaggregated, prof),
             _row("naive 1:1 async", plan.naive, prof)]
    pred = best.best_estimate
    sync = plan.best_sync.best_estimate
    naive = plan.naive.best_estimate
    rows.append(f"planned {pred:.1f} steps/s (DES) vs best sync ({plan.best_sync.layout.placement}) {sync:.1f}: "
                f"{(pred / sync - 1) * 100:+.1f}%; vs naive 1:1 {naive:.1f}: {(pred / naive - 1) * 100:+.1f}%; "
                f"env:GPU ratio {best.layout.num_envs / plan.gpus:.1f} envs per GPU, "
                f"mean staleness {best.des.staleness:.2f} versions" if best.des else "")
    return "\n".join(rows)


def gpu_budgets(text: str) -> tuple[int, ...]:
    """--gpus: one budget (`32`) or a scaling range (`8..256`: every power of two from 8 to 256)."""
    lo, _, hi = text.partition("..")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus {text!r}: give a number (32) or a range (8..256)") from None
    if a < 1 or b < a:
        raise argparse.ArgumentTypeError(f"--gpus {text!r}: the range must run upwards from 1 or more")
    out, g = [], a
    while g <= b:
        out.append(g)
        g *= 2
    return tuple(out)


SCALING_PAPER = ("the paper (RL-VLA3, LIBERO + pi0.5) reports near-linear scaling from 8 to 24 GPUs and less "
                 "than linear beyond")


def scaling_text(profile: Profile, budgets: tuple[int, ...], cpu_cores: int | None, des_checks: int, seed: int) -> str:
    """The planned throughput per GPU budget with the profile's site terms (network, filesystem)
    and without them, and what the site costs at each budget."""
    from .network import broadcast_ms, has_site, ideal

    rows = [f"profile {profile.name}: planned async throughput by GPU budget (model predictions; DES-checked), with the "
            f"site's network and filesystem terms and without them (an ideal site)",
            f"{'GPUs':>5s} {'site steps/s':>13s} {'per GPU':>8s} {'scaling':>8s} {'ideal steps/s':>14s} {'per GPU':>8s} "
            f"{'scaling':>8s} {'site cost':>9s} {'publish ms':>10s}  bound (site)"]
    if not has_site(profile):
        rows.insert(1, "note: this profile has no site terms (weights_mb, net_gbps, fs_mbps, ...): both curves are the same")
    base = None
    for gpus in budgets:
        site = propose(profile, gpus, cpu_cores, des_checks, seed).best
        free = propose(ideal(profile), gpus, cpu_cores, des_checks, seed).best
        s, f = site.best_estimate, free.best_estimate
        base = base or (s / gpus, f / gpus, gpus)
        rows.append(f"{gpus:5d} {s:13.1f} {s / gpus:8.1f} {s / gpus / base[0]:7.0%} {f:14.1f} {f / gpus:8.1f} "
                    f"{f / gpus / base[1]:7.0%} {1 - s / f:8.0%} {broadcast_ms(profile, site.layout.gen_gpus):10.0f}  "
                    f"{site.analytic.bottleneck}")
    rows.append(f"scaling = throughput per GPU relative to {base[2]} GPUs; site cost = 1 - site / ideal; publish = the "
                f"relay tree's broadcast of weights_mb to the planned Generators")
    rows.append(f"note: {SCALING_PAPER}")
    return "\n".join(rows)


def ladder_text(profile: Profile, gpus: int, cpu_cores: int | None, seed: int) -> str:
    rows = [f"profile {profile.name}: predicted ablation ladder at {gpus} GPUs (model predictions), beside the "
            f"paper's LIBERO + pi0.5 rows at {PAPER_GPUS} GPUs (secondary transcriptions [S], not verified)",
            f"{'rung':38s} {'analytic':>9s} {'DES':>9s} {'vs colo':>8s} {'paper[S]':>9s} {'vs colo':>8s}  bound"]
    base_model = base_paper = None
    for name, lay in ladder_layouts(profile, gpus, cpu_cores):
        a = analytic(profile, lay)
        d = simulate(profile, lay, seed)
        paper = PAPER_LIBERO_PI05.get(name)
        base_model = base_model or d.steps_per_s
        base_paper = base_paper or paper
        rows.append(f"{name:38s} {a.steps_per_s:9.1f} {d.steps_per_s:9.1f} {(d.steps_per_s / base_model - 1) * 100:+7.1f}% "
                    f"{paper:9.2f} {(paper / base_paper - 1) * 100:+7.1f}%  {a.bottleneck}")
    if gpus != PAPER_GPUS:
        rows.append(f"note: the paper's rows are for {PAPER_GPUS} GPUs; compare the relative columns only")
    return "\n".join(rows)


def write_config(plan: Proposal, path: Path) -> None:
    """The planned layout as a cluster config (`cluster=<file stem>` when under conf/cluster/)."""
    tree = overrides(plan.profile, plan.best.layout, path.stem)
    b = plan.best
    header = (f"Written by: python -m rlvla3.plan show --profile <{plan.profile.name}> --gpus {plan.gpus} --write {path}\n"
              f"Model prediction (not a measurement): {b.best_estimate:.0f} env steps/s async vs best sync "
              f"{plan.best_sync.best_estimate:.0f}, naive 1:1 {plan.naive.best_estimate:.0f}.\n"
              "Partitions are placeholders; conf/site/local.yaml overrides them.")
    path.write_text(overrides_yaml(tree, header))


def measure(args) -> int:
    """`profile <run> [--profile out.yaml]`: fit a Profile to a run folder and print/write it."""
    import dataclasses

    from .measure import profile_from_run

    if args.run is None:
        print("plan error: profile needs a run folder: python -m rlvla3.plan profile runs/<date>/<time>", file=sys.stderr)
        return 2
    try:
        prof = profile_from_run(args.run)
    except (PlannerError, FileNotFoundError) as e:
        print(f"plan error: {e}", file=sys.stderr)
        return 2
    for k, v in dataclasses.asdict(prof).items():
        print(f"{k:22s} {v:.4g}" if isinstance(v, float) else f"{k:22s} {v}")
    if args.profile:
        save_profile(prof, args.profile)
        print(f"wrote {args.profile}")
    return 0


def validate(args) -> int:
    import json
    import tempfile

    from . import validate as V

    profile = load_profile(args.profile or CONF_DIR / "profile/emulated_validation.yaml")
    out = args.out or Path(tempfile.mkdtemp(prefix="rlvla3-validate-"))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for ranks in (int(r) for r in args.ranks.split(",")):
            for mode in args.modes.split(","):
                rows.append(V.measure(profile, ranks, mode, out, args.seed, args.versions))
                r = rows[-1]
                print(f"  {mode:5s} {ranks:3d} ranks: engine {r['measured']:7.1f} steps/s, DES {r['des']:7.1f} "
                      f"({r['err_des']:+.1%}), analytic {r['analytic']:7.1f} ({r['err_analytic']:+.1%}), "
                      f"framework efficiency {r['efficiency']:.0%}", flush=True)
    except PlannerError as e:
        print(f"plan error: {e}", file=sys.stderr)
        return 2
    print(f"profile {profile.name}: predicted vs measured env steps/s (error = predicted / measured - 1)")
    print(V.table(rows))
    (out / "validate.json").write_text(json.dumps(rows, indent=1))
    print(f"run folders and validate.json: {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.plan", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("show", "ladder", "profile", "validate"))
    ap.add_argument("run", nargs="?", type=Path, help="profile: the run folder to measure")
    ap.add_argument("--profile", type=Path, help="planner profile YAML (conf/profile/*.yaml); profile: where to write it")
    ap.add_argument("--gpus", type=gpu_budgets, help="GPU budget (whole GPU nodes); show: A..B prints the scaling "
                                                      "curve over the powers of two from A to B")
    ap.add_argument("--cpu-cores", type=int, default=None,
                    help=f"CPU cores for Simulators (default {CPU_CORES_PER_GPU} per GPU)")
    ap.add_argument("--des-checks", type=int, default=DES_CHECKS, help="best analytic candidates re-checked by the DES")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write", type=Path, default=None, help="show: write the plan as a cluster config here")
    ap.add_argument("--ranks", default="8,16,32", help="validate: rank counts (multiples of 4)")
    ap.add_argument("--modes", default="sync,async", help="validate: sync, async or both")
    ap.add_argument("--out", type=Path, default=None, help="validate: folder for the run folders and validate.json")
    ap.add_argument("--versions", type=int, default=None, help="validate: versions per engine run (the first is not measured)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.command == "profile":
        return measure(args)
    if args.command == "validate":
        return validate(args)
    if args.profile is None or args.gpus is None:
        ap.error(f"{args.command} needs --profile and --gpus")
    try:
        profile = load_profile(args.profile)
        if len(args.gpus) > 1:
            require(not args.write, "--write", args.write, "write one plan at a time: give --gpus a single budget")
            print(scaling_text(profile, args.gpus, args.cpu_cores, max(1, args.des_checks), args.seed))
            return 0
        if args.command == "ladder":
            print(ladder_text(profile, args.gpus[0], args.cpu_cores, args.seed))
            return 0
        plan = propose(profile, args.gpus[0], args.cpu_cores, max(1, args.des_checks), args.seed)
        print(show_text(plan))
        if args.write:
            write_config(plan, args.write)
            print(f"wrote {args.write}")
    except (PlannerError, FileNotFoundError) as e:
        print(f"plan error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
