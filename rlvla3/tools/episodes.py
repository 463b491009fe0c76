"""An evaluation run's episodes, shared by `python -m rlvla3.evaluate` and its LIBERO protocol:
the config that makes a run evaluate whole episodes, reading them back from its shards, and the
Wilson interval of a success rate; and any run's recorded episodes, whole, for an export."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..policies import execute_steps


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a success rate (sound at 0, 1 and small n, unlike p ± z·se)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def eval_rounds(cfg, episodes: int) -> int:
    """Rollout steps of an evaluation of about `episodes` episodes: each runs one episode in every
    env, so it runs this times env.num_envs episodes (at least `episodes`)."""
    return math.ceil(episodes / cfg.env.num_envs)


def eval_overrides(cfg, checkpoint: str, episodes: int) -> dict:
    """Config sections that turn `cfg` into an evaluation run of about `episodes` episodes."""
    seg = math.ceil(cfg.env.horizon / execute_steps(cfg.policy))
    rollout = cfg.env.num_envs * seg
    return {"policy": {"init_from": checkpoint}, "runtime": {"evaluate": True},
            "algo": {"segment_steps": seg, "rollout_batch": rollout, "global_batch": rollout,
                     "micro_batch": min(cfg.algo.micro_batch, rollout), "update_epochs": 1,
                     "max_versions": eval_rounds(cfg, episodes)}}


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


def text_at(changes: list, row: int) -> str:
    """The instruction of `row` from an env's [row, text] changes (a shard's `instructions`)."""
    return next(text for r, text in reversed(changes) if r <= row)


class RecordedEpisodes:
    """Every whole episode a run's shards recorded, demonstrations (episodes run across segments)
    and rollouts alike, group after group, each env's in the order they ended: dicts of images
    [T, cams, H, W, 3], proprio [T, P], actions [T, K, D], rewards [T], success (bool), task
    (the instruction text), seed (its reset seed, -1 when not recorded) and env_id. An episode
    still running when its group stopped is left out and counted in `partial` once iterated.
    `versions`: only the shards of the first `versions` rollout steps (an evaluation's count)."""

    def __init__(self, run_dir: Path, versions: int | None = None):
        self.run_dir, self.versions = Path(run_dir), versions
        self.partial = 0

    def __iter__(self):
        from ..engine import shards

        by_group: dict[int, list[str]] = {}
        for n in shards.scan(self.run_dir / "shards"):
            step, gid, _ = shards.parse_name(n)
            if self.versions is None or step < self.versions:
                by_group.setdefault(gid, []).append(n)
        self.partial = 0
        for _, names in sorted(by_group.items()):
            running: dict[int, dict] = {}   # env column -> its episode so far
            for n in sorted(names, key=lambda n: shards.parse_name(n)[2]):
                a, attrs = shards.read_shard(self.run_dir / "shards" / n)
                if "instructions" not in attrs:
                    raise RuntimeError(f"shard {n}: no `instructions` attribute (written before rlvla3 recorded "
                                       "instruction texts), so its episodes have no task strings; record them again")
                seeds = attrs.get("reset_seeds") or [-1] * attrs["n_envs"]
                for e, env_id in enumerate(attrs["env_ids"]):
                    for t in np.flatnonzero(a["valid"][:, e]).tolist():
                        ep = running.setdefault(e, {"rows": [], "seed": int(seeds[e]), "env_id": env_id,
                                                    "task": text_at(attrs["instructions"][e], t)})
                        ep["rows"].append((a, e, t))
                        if a["terminated"][t, e] or a["truncated"][t, e]:
                            yield _episode(running.pop(e))
            self.partial += len(running)


def _episode(ep: dict) -> dict:
    def rows(key: str) -> np.ndarray:
        return np.stack([a[key][t, e] for a, e, t in ep["rows"]])

    return {"images": rows("images"), "proprio": rows("proprio"), "actions": rows("actions"),
            "rewards": rows("rewards"), "success": bool(rows("success").any()), "task": ep["task"],
            "seed": ep["seed"], "env_id": ep["env_id"]}
