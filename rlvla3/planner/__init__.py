"""The planner: how to spend G GPUs (and the CPU cores beside them) on an rlvla3 run.

Two models of the engine, both fed by a `Profile` of measured (or hand-written) component costs,
in rooms along the planner's own seams (times inside the models are ms; results env steps/s):

    profile.py    Profile, its YAML form, PlannerError
    layout.py     a candidate Layout and what follows from it (sharding, lockstep components)
    analytic.py   the bottleneck model (microseconds a call, so the search can use it)
    des.py        the discrete-event simulation of the engine (simpy; the engine's own batcher)
    network.py    the site (weight broadcast down the relay tree, network latency, message CPU,
                  the shared filesystem) as the costs both models read
    search.py     propose(profile, gpus): analytic search, DES re-check, sync and naive baselines
    overrides.py  a layout as Hydra overrides (planned cluster configs, emulated validation runs)
    measure.py    a Profile measured from a run folder
    validate.py   the models against the real engine running emulated costs
    cli.py        `python -m rlvla3.plan show|ladder|profile|validate` (show --gpus 8..256: scaling)

This face names the models' public parts, so a caller writes `from rlvla3 import planner as P`.
"""
from .analytic import Estimate, analytic, group_step_ms
from .des import DesResult, simulate
from .layout import Layout, layout_sharding
from .network import broadcast_ms, effective, ideal, relay_depth
from .overrides import emulation_overrides, override_strings, overrides, overrides_yaml, run_overrides
from .profile import MS_PER_S, PlannerError, Profile, load_profile, save_profile
from .search import CPU_CORES_PER_GPU, DES_CHECKS, Proposal, Scored, env_budget, ladder_layouts, propose, sync_layouts

__all__ = [
    "CPU_CORES_PER_GPU", "DES_CHECKS", "DesResult", "Estimate", "Layout", "MS_PER_S", "PlannerError", "Profile",
    "Proposal", "Scored", "analytic", "broadcast_ms", "effective", "emulation_overrides", "env_budget", "group_step_ms", "ladder_layouts",
    "ideal", "layout_sharding", "load_profile", "override_strings", "overrides", "overrides_yaml", "propose",
    "relay_depth", "run_overrides", "save_profile", "simulate", "sync_layouts",
]
