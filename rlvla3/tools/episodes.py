"""An evaluation run's episodes, shared by `python -m rlvla3.evaluate` and its LIBERO protocol:
the config that makes a run evaluate whole episodes, reading them back from its shards, and the
Wilson interval of a success rate."""
from __future__ import annotations

import math
from pathlib import Path


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sound at 0, 1 and small n, unlike p ± z·se)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def eval_overrides(cfg, checkpoint: str, episodes: int) -> dict:
    """Config sections that turn `cfg` into an evaluation run of about `episodes` episodes."""
    seg = math.ceil(cfg.env.horizon / cfg.policy.chunk)
    rollout = cfg.env.num_envs * seg
    return {"policy": {"init_from": checkpoint}, "runtime": {"evaluate": True},
            "algo": {"segment_steps": seg, "rollout_batch": rollout, "global_batch": rollout,
                     "micro_batch": min(cfg.algo.micro_batch, rollout), "update_epochs": 1,
                     "max_versions": math.ceil(episodes / cfg.env.num_envs)}}


def evaluation_segments(run_dir: Path, versions: int):
    """(arrays, seeds [N], success [N]) of each shard of the first `versions` rollout steps of
    an evaluation run: every env of such a segment ran exactly one episode."""
    from ..engine import shards

    for n in shards.scan(run_dir / "shards"):
        if shards.parse_name(n)[0] >= versions:
            continue
        a, attrs = shards.read_shard(run_dir / "shards" / n)
        ended = (a["terminated"] | a["truncated"]).any(0)
        if not ended.all():
            raise RuntimeError(f"evaluation shard {n}: an episode did not end inside its segment")
        success = (a["success"] & a["valid"]).any(0)
        yield a, attrs.get("reset_seeds") or [-1] * success.size, success


def whole_episodes(run_dir: Path, versions: int):
    """(reset seed, success, env steps) of each episode of an evaluation run's first `versions`
    rollout steps."""
    for a, seeds, success in evaluation_segments(run_dir, versions):
        lengths = (a["env_steps"] * a["valid"]).sum(0)
        yield from ((int(seed), bool(s), int(n_steps)) for seed, s, n_steps in zip(seeds, success, lengths))


def count(run_dir: Path, versions: int) -> tuple[int, int]:
    """(successes, episodes) of an evaluation run's first `versions` rollout steps."""
    eps = list(whole_episodes(run_dir, versions))
    return sum(s for _, s, _ in eps), len(eps)
