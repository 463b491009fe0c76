"""`python -m rlvla3.bench throughput [--env emulated|robosuite|toy|libero|maniskill] [--ladder] [overrides...]`
   `python -m rlvla3.bench weights [--params 1e6,1e7,1e8] [--generators 1,4,16] [--methods relay,ibcast]`
   `python -m rlvla3.bench families [--batches 1,8,32] [--families tiny,openvla,...] [--size tiny|published] [overrides...]`
   `python -m rlvla3.bench memory [--families openvla,openvla_oft,pi0,pi05] [--copies 1]`
   `python -m rlvla3.bench parity [--families openvla_oft,pi05] [--ranks 1,2,4] [overrides...]`   (FSDP against one rank)
   `python -m rlvla3.bench faults [--minutes 10] [--seed 0] [overrides...]`
   `python -m rlvla3.bench ckpt [--params 1e6,1e7,1e8] [--repeats 3] [--versions 50]`
   `python -m rlvla3.bench serving --params 1e8 --generators 4 [--versions 8]`   (replies while a version arrives)
   `python -m rlvla3.bench fidelity [--suite libero_spatial] [--tasks 0,5] [--control]`   (tools/libero_fidelity.py)
   `python -m rlvla3.bench obs [overrides...]`   (observation compression)
   `python -m rlvla3.bench latency [--topologies 1+1,16+4] [--wakes doorbell,doorbell+expect,...]`
   `python -m rlvla3.bench sims [--tasks Lift,...,pick-place-v3,...,libero,maniskill_PickCube] [--episodes 10] [overrides...]`

Each benchmark is one module of this package, `rlvla3/benchmarks/<what>.py`, whose `run(args)`
prints its table, saves its rows as JSON under --out and returns the exit status; `fidelity` is
LIBERO's port check (tools/libero_fidelity.py), with options of its own.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from .families import FAMILY_RUNS
from .sims import LIBERO_TASKS, SIM_TASKS
from .throughput import WORKLOADS

BENCHES = ("throughput", "weights", "families", "memory", "sims", "faults", "shards", "latency", "obs", "ckpt", "serving", "parity")


def parser() -> argparse.ArgumentParser:
    """The options of every subcommand but fidelity, which has its own (tools/libero_fidelity.py)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=[*BENCHES, "fidelity"])
    ap.add_argument("--minutes", type=float, default=10.0, help="faults: how long to inject faults")
    ap.add_argument("--seed", type=int, default=0, help="faults: the random choice of faults and moments")
    ap.add_argument("--tasks", default=",".join(t for t in SIM_TASKS if t not in LIBERO_TASKS),
                    help=f"sims: any of {', '.join(SIM_TASKS)}; libero = every LIBERO row")
    ap.add_argument("--episodes", type=int, default=10, help="sims: episodes per task")
    ap.add_argument("--chunks", default="1", help="sims: action chunk lengths of the random-action rows (a row each)")
    ap.add_argument("--batches", default="1,8,32", help="families: batch sizes")
    ap.add_argument("--families", default="", help=f"families: a comma list of {','.join(FAMILY_RUNS)} (default: all); "
                                                   "memory: of openvla,openvla_oft,pi0,pi05; parity: of openvla_oft,pi05")
    ap.add_argument("--ranks", default="", help="parity: FSDP Trainer rank counts (default 1,2,4)")
    ap.add_argument("--copies", type=int, default=1, help="memory: frozen copies of the trainable weights (π_prox, a KL reference)")
    ap.add_argument("--repeats", type=int, default=5, help="families, shards, obs, ckpt: timed repeats per measurement (median)")
    ap.add_argument("--size", choices=["tiny", "published"], default="tiny",
                    help="families: tiny sizes (any device), or the released sizes as the LIBERO presets set them up (a GPU)")
    ap.add_argument("--params", default="1e6,1e7,1e8", help="weights, ckpt, serving: parameter counts")
    ap.add_argument("--versions", type=int, default=None,
                    help="ckpt: versions of the run whose checkpoint folder is watched (default 50); serving: "
                         "versions published (default 8)")
    ap.add_argument("--generators", default="1,4,16", help="weights, serving: Generator counts")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="weights: wire formats")
    ap.add_argument("--methods", default="relay", help="weights: relay (the engine's relay tree), ibcast (MPI's non-blocking broadcast)")
    ap.add_argument("--fanouts", default="0,2", help="weights: relay tree fanouts (0: Trainer 0 sends to every Generator)")
    ap.add_argument("--bucket-mb", type=float, default=64.0, help="weights: bucket size (MiB)")
    ap.add_argument("--topologies", default="1+1,16+4", help="latency: Simulators+Generators")
    ap.add_argument("--wakes", default="sleep,doorbell,doorbell+expect,doorbell+spin", help="latency: how idle ranks wait")
    ap.add_argument("--step-ms", type=float, default=0.0, help="latency: emulated env step (default: 5 ms at 1+1, 80 at 16+4)")
    ap.add_argument("--requests", type=int, default=500, help="latency: action requests per Simulator")
    ap.add_argument("--spin-us", type=float, default=10000.0,
                    help="latency: runtime.spin_us of the doorbell+spin rows (default: longer than a 1+1 step)")
    ap.add_argument("--idle-step-ms", type=float, default=200.0, help="latency: env step of the idle row")
    ap.add_argument("--idle-seconds", type=float, default=20.0, help="latency: length of the idle row")
    ap.add_argument("--env", choices=sorted(WORKLOADS), default="emulated")
    ap.add_argument("--ladder", action="store_true", help="the full ablation ladder")
    ap.add_argument("--out", default="", help="folder for the run folders (default: a temporary one)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per configuration")
    ap.add_argument("overrides", nargs="*", help="extra config overrides for every configuration")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fidelity"]:   # its own options (tools/libero_fidelity.py)
        from ..tools.libero_fidelity import main as fidelity

        return fidelity(argv[1:])
    a = parser().parse_intermixed_args(argv)  # overrides may follow options
    return importlib.import_module(f"{__package__}.{a.what}").run(a)
