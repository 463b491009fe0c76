"""`python -m rlvla3.collect [--episodes N] [--out DIR] [overrides...]`: demonstrations from the
env's scripted expert (envs/experts.py), written as trajectory shards in the engine's format.

Like a rollout, the envs are spread over `cluster.sim_ranks` MPI ranks by the sharding plan, each
env in its own process (or in-process for cheap envs); there is no Generator: the expert runs
inside the env's process on privileged state. Each group records segments of
`algo.segment_steps` rows until its envs have finished their share of `--episodes`, and
publishes each segment as a shard (atomic rename, engine/shards.py). Demonstration rows have one
expert step each (chunk 1; a chunked policy's SFT takes consecutive rows), `logprobs` and
`values` 0, `versions` -1, and `sample` = the expert action in the policy's sample layout
(token families: the nearest bin ids; pi0: a chain whose last step is the action).

    python -m rlvla3.collect env=robosuite_lift env.num_envs=4 cluster.sim_ranks=2 --episodes 20

`--format lerobot` also writes the whole episodes as a LeRobotDataset v3.0 in <out>/lerobot
(tools/lerobot_dataset.py), which `python -m rlvla3.sft --demos <out>/lerobot` reads back.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

from ..policies.sampling import expert_sample


def quota(total: int, group, num_envs: int) -> int:
    """Episodes a group records: its envs' share of the total (rounded up)."""
    return math.ceil(total * group.size / num_envs)


def rank_main(run_dir: Path, episodes: int) -> None:
    """One Simulator-like rank: its groups step with the expert until their quotas are met."""
    from mpi4py import MPI

    from .. import config
    from ..engine.simulator import SegmentBuffer
    from ..envs.hosting import make_vec_env
    from ..policies.prompts import instruction_encoder
    from ..world import derive, spec

    rank = MPI.COMM_WORLD.rank
    cfg = config.load(run_dir)
    world = derive(cfg)
    sp = spec(cfg)
    out = run_dir / "shards"
    out.mkdir(parents=True, exist_ok=True)
    T = cfg.algo.segment_steps
    encode = instruction_encoder(cfg.policy)
    groups = []
    for g in world.groups_of_sim(rank):
        env = make_vec_env(cfg, list(range(g.env_offset, g.env_offset + g.size)), cfg.seed,
                           auto_reset=not world.episodic, encode=encode)
        env.start_reset()
        groups.append({"g": g, "env": env, "seq": 0, "t": 0, "done": 0, "cur": None, "stepping": False,
                       "seg": SegmentBuffer.allocate(T, g.size, sp), "left": quota(episodes, g, cfg.env.num_envs)})
    # A collection may run for hours (--timeout bounds it); what must not happen is an env that
    # stops answering: no result from any group for this long fails the rank, naming them. Its
    # env children restart or fail within env.start_timeout themselves: this catches the rest.
    stall = max(cfg.runtime.liveness_timeout * 10, 2 * cfg.env.start_timeout)
    heard = time.monotonic()
    while any(x["left"] > 0 or x["t"] > 0 for x in groups):
        if time.monotonic() - heard > stall:
            raise TimeoutError(f"collect rank {rank}: no env result for {stall:.0f}s; "
                               f"env groups still collecting (group, episodes left): "
                               f"{[(x['g'].gid, x['left']) for x in groups if x['left'] > 0 or x['t'] > 0]}")
        busy = False
        for x in groups:
            if x["left"] <= 0 and x["t"] == 0:
                continue
            if not x["env"].ready():
                busy = True
                continue
            res = x["env"].result()
            heard = time.monotonic()
            if x["stepping"]:
                _record(x, res, sp, cfg)
                if x["t"] == T:
                    _publish(x, out, world, sp, cfg, rank)
            x["cur"] = res
            if x["left"] > 0 or x["t"] > 0:
                x["env"].start_step(None)
                x["stepping"] = True
            busy = True
        if not busy:
            break
        time.sleep(0.0005)
    for x in groups:
        x["env"].close()
    print(f"[collect rank {rank}] wrote {sum(x['seq'] for x in groups)} shard(s), "
          f"{sum(x['done'] for x in groups)} episodes", flush=True)


def _record(x: dict, res, sp, cfg) -> None:
    s, t, prev = x["seg"].arrays, x["t"], x["cur"]
    s["images"][t], s["proprio"][t], s["tokens"][t] = prev.images, prev.proprio, prev.tokens
    x["seg"].note_texts(t, prev.instructions)
    s["actions"][t] = res.actions[:, None]
    s["sample"][t] = expert_sample(sp.sample, res.actions, cfg.policy.action_bins)
    s["rewards"][t], s["terminated"][t], s["truncated"][t], s["success"][t] = (
        res.reward, res.terminated, res.truncated, res.success)
    s["env_steps"][t], s["valid"][t], s["versions"][t] = res.env_steps, True, -1
    ended = int((res.terminated | res.truncated).sum())
    x["done"] += ended
    x["left"] -= ended
    x["t"] += 1


def _publish(x: dict, out: Path, world, sp, cfg, rank: int) -> None:
    from ..engine import shards
    from ..engine.simulator import SegmentBuffer, segment_meta

    g = x["g"]
    name, attrs = segment_meta(cfg, world, g, x["seq"], rank)
    shards.write_shard(out, name, x["seg"].arrays, np.zeros(g.size, np.float32),
                       {**attrs, "source": "expert", "instructions": x["seg"].texts}, cfg.runtime.shard_codec)
    x["seg"] = SegmentBuffer.allocate(cfg.algo.segment_steps, g.size, sp)
    x["seq"] += 1
    x["t"] = 0


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.collect", description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=20, help="episodes in total (spread over the env groups)")
    ap.add_argument("--out", default="", help="run folder (default runs/demos/<date>-<time>)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for the whole collection")
    ap.add_argument("--format", choices=["shards", "lerobot"], default="shards",
                    help="lerobot: also write the whole episodes as a LeRobotDataset v3.0 in <out>/lerobot")
    ap.add_argument("--rank-main", default="", help=argparse.SUPPRESS)   # set by the launcher for each rank
    ap.add_argument("overrides", nargs="*", help="config overrides, as for python -m rlvla3.launch")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_intermixed_args(argv)
    if a.rank_main:
        rank_main(Path(a.rank_main), a.episodes)
        return 0
    import subprocess

    from .. import config
    from ..cluster.compose import compose, write_run_records
    from ..cluster.local import mpi_env, mpiexec_command
    from ..world import derive

    if a.episodes < 1:
        raise SystemExit(f"--episodes={a.episodes}: must be >= 1")
    cfg = compose(a.overrides)
    # One expert step per row, recorded as a stream with auto-resets whatever algorithm later
    # trains on the demonstrations (grpo's whole-episode segments and shared resets are for rollouts).
    cfg = config.replace(cfg, policy={"chunk": 1}, algo={"name": "ppo"})
    refuse_tasks_without_expert(cfg)
    run_dir = Path(a.out or f"runs/demos/{datetime.now():%Y-%m-%d-%H-%M-%S}")
    world = derive(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = config.replace(cfg, run_dir=str(run_dir))
    config.save(cfg, run_dir)
    write_run_records(cfg, run_dir)   # LIBERO: which initial states the demonstrations used
    cmd = mpiexec_command(cfg, len(world.sim_ranks), run_dir)
    cmd = [*cmd[:cmd.index("rlvla3.engine.run")], "rlvla3.tools.collect", "--rank-main", str(run_dir), "--episodes", str(a.episodes)]
    print("$ " + " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=mpi_env(), timeout=a.timeout).returncode
    if rc == 0:
        print(summarize(run_dir))
    if rc == 0 and a.format == "lerobot":
        from .lerobot_dataset import export_lerobot

        print(export_lerobot(run_dir, cfg))
    return rc


def refuse_tasks_without_expert(cfg) -> None:
    """Stop before any rank starts when a task of cfg.env has no scripted expert to demonstrate it."""
    from ..envs import expert_tasks

    if cfg.env.name == "libero":   # the expert follows each task's BDDL goal: read them in LIBERO's interpreter
        from ..envs.libero_experts import has_expert
        from .libero_protocol import sim_facts

        goals = sim_facts(cfg)["goals"]
        bad = [i for i in cfg.env.task_ids if not 0 <= i < len(goals) or not has_expert(goals[i])]
        if bad:
            able = [i for i, g in enumerate(goals) if has_expert(g)]
            raise SystemExit(f"env.suite={cfg.env.suite} env.task_ids={list(cfg.env.task_ids)}: tasks {bad} have no "
                             f"scripted expert (it does one `In`/`On` pick-and-place goal; this suite's tasks {able} "
                             "have one): rlvla3/envs/libero_experts.py")
        return
    tasks = expert_tasks(cfg)
    if tasks is not None and cfg.env.task not in tasks:
        raise SystemExit(f"env.name={cfg.env.name} env.task={cfg.env.task}: no scripted expert; experts exist for "
                         f"{tasks or 'no task of this env'} (rlvla3/envs/experts.py)")


def summarize(run_dir: Path) -> str:
    """Episodes, successes and rows in the demonstration shards of a run folder."""
    from ..engine import shards

    names = shards.scan(run_dir / "shards")
    eps = succ = rows = 0
    for n in names:
        at = shards.read_attrs(run_dir / "shards" / n)
        eps, succ, rows = eps + at["episode_ends"], succ + at["successes"], rows + at["rows"]
    return (f"{len(names)} shards, {rows} rows, {eps} episodes ended, {succ} successes "
            f"({succ / max(eps, 1):.0%}) in {run_dir / 'shards'}")


if __name__ == "__main__":
    sys.exit(main())
