"""A layout as Hydra overrides of the run config: what `plan show --write` saves as a cluster
config and what `plan validate` hands to the engine."""
from __future__ import annotations

from ..config import PolicyConfig
from .layout import CORES_PER_GPU_NODE, CPUS_PER_GPU_RANK, CPUS_PER_SIM_RANK, MICRO_BATCH, SEGMENT_STEPS, Layout, layout_sharding
from .profile import Profile


def run_overrides(layout: Layout, sharding: list[list[int]]) -> dict:
    """The engine settings of `layout` (envs, sharding, batch sizes, batcher, mode switches)."""
    out = {
        "env": {"num_envs": layout.num_envs},
        "sharding": {"plan": sharding},
        "algo": {"rollout_batch": layout.rollout_batch, "global_batch": layout.global_batch,
                 "micro_batch": min(MICRO_BATCH, layout.global_batch), "segment_steps": SEGMENT_STEPS},
        "generator": {"b_max": layout.b_max, "t_max_ms": float(layout.t_max_ms)},
        "mode": {"env_level": layout.env_level, "overlap": layout.overlap, "streaming": layout.streaming,
                 "eta": layout.eta, "placement": layout.placement},
    }
    if layout.b_max > PolicyConfig().max_batch:
        out["policy"] = {"max_batch": layout.b_max}
    return out


def overrides(profile: Profile, layout: Layout, name: str) -> dict:
    """The cluster config the launcher accepts for `layout` (same keys as conf/cluster/slurm_*.yaml;
    partitions are placeholders that conf/site/local.yaml overrides)."""
    plan = layout_sharding(profile, layout)
    cluster = {
        "cluster": {
            "name": name,
            "sim_ranks": len(plan),
            "gen_ranks": layout.gen_gpus,
            "train_ranks": layout.train_gpus,
            "gpus_per_node": profile.gpus_per_node,
            "cores_per_gpu_node": CORES_PER_GPU_NODE,
            "cores_per_cpu_node": profile.cores_per_cpu_node,
            "cpus_per_sim_rank": CPUS_PER_SIM_RANK,
            "cpus_per_gpu_rank": CPUS_PER_GPU_RANK,
            "cpu_partition": "cpu",
            "gpu_partition": "gpu",
            "time": "04:00:00",
        },
    }
    return {**cluster, **run_overrides(layout, plan)}


def emulation_overrides(profile: Profile) -> dict:
    """env=emulated policy=emulated settings that make the engine pay `profile`'s costs."""
    return {
        "env": {"name": "emulated", "step_ms": profile.step_ms, "step_sigma": profile.step_sigma,
                "reset_ms": profile.reset_ms, "horizon": profile.episode_steps},
        "policy": {"name": "emulated", "infer_fixed_ms": profile.infer_fixed_ms,
                   "infer_per_sample_ms": profile.infer_per_sample_ms, "max_batch": profile.max_batch,
                   "train_samples_per_s": profile.train_samples_per_s, "weight_sync_ms": profile.weight_sync_ms},
    }


def override_strings(tree: dict) -> list[str]:
    """Hydra command-line overrides (key.path=value) for a nested overrides dict."""
    out = []

    def walk(prefix: str, node):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(node, list):
            out.append(f"{prefix}={_hydra_value(node)}")
        else:
            out.append(f"{prefix}={_hydra_value(node)}")

    walk("", tree)
    return out


def _hydra_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    if isinstance(v, str):
        return f"'{v}'" if ":" in v else v
    return repr(v)


def overrides_yaml(tree: dict, header: str) -> str:
    """The cluster file text: a Hydra _global_ package selecting the project's Slurm launcher."""
    import yaml

    body = yaml.safe_dump(tree, sort_keys=False, default_flow_style=None, width=100)
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return ("# @package _global_\n" + comment +
            "defaults:\n  - override /hydra/launcher: rlvla3_slurm\n" + body)
