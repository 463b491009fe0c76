"""`python -m rlvla3.bench sims [--tasks Lift,...,pick-place-v3,...,libero,maniskill_PickCube] [--episodes 10] [overrides...]`:
step and reset times of each simulator task and its scripted expert's success."""
from __future__ import annotations

import numpy as np

from ..cluster.compose import compose
from .common import save_rows

SIM_TASKS = {"Lift": ["env=robosuite_lift"], "Stack": ["env=robosuite_stack"],
             "PickPlaceCan": ["env=robosuite_pickplacecan"], "Door": ["env=robosuite_door"],
             **{t: ["env=metaworld_pickplace", f"env.task={t}"]
                for t in ("pick-place-v3", "reach-v3", "drawer-open-v3", "button-press-topdown-v3")}}
# LIBERO (task 0 of each suite, under .venv-libero): conf/env/libero.yaml's two 128x128 cameras
# with fast render, and on libero_spatial one change at a time (stock render, one camera, 224x224,
# soft resets).
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
LIBERO_TASKS = {**{s: ["env=libero", f"env.suite={s}"] for s in LIBERO_SUITES},
                "libero_spatial@stock": ["env=libero", "env.fast_render=false"],
                "libero_spatial@1cam": ["env=libero", "env.cameras=[agentview]"],
                "libero_spatial@224": ["env=libero", "env.image_size=224", "policy.patch=16"],
                "libero_spatial@soft": ["env=libero", "env.hard_reset=false"]}
SIM_TASKS.update(LIBERO_TASKS)
SIM_TASKS.update({f"maniskill_{t}": ["env=maniskill", f"env.task={t}-v1"] for t in ("PickCube", "PushCube", "StackCube")})


def sim_task_names(tasks: str) -> list[str]:
    """--tasks: names of SIM_TASKS, `libero` standing for every LIBERO row."""
    names = [n for t in tasks.split(",") for n in (LIBERO_TASKS if t == "libero" else [t])]
    bad = [n for n in names if n not in SIM_TASKS]
    if bad:
        raise SystemExit(f"--tasks: unknown {bad}; use libero or any of {', '.join(SIM_TASKS)}")
    return names


def steps_by_expert(cfg) -> bool:
    """Whether `bench sims` drives cfg's task by its scripted expert (else random actions)."""
    from ..envs import expert_tasks

    tasks = expert_tasks(cfg)
    return tasks is None or cfg.env.task in tasks


def time_episodes(cfg, episodes: int, chunk: int = 1) -> dict:
    """One env hosted as a Simulator hosts it (in-process or its child process, env.python
    included): its start (process, build and first reset), time per env step inside the env, later
    reset round trips, and the expert's successes (an env without an expert steps random actions
    in chunks of `chunk`, drawing only each chunk's last frame as a policy's rollout does, so only
    its timings count)."""
    import time

    from ..envs import env_dims
    from ..envs.hosting import make_vec_env
    from ..policies.prompts import instruction_encoder

    expert = steps_by_expert(cfg)
    env = make_vec_env(cfg, [0], 0, auto_reset=False, encode=instruction_encoder(cfg.policy))
    rng, dim = np.random.default_rng(0), env_dims(cfg).action_dim
    steps, resets, wins, lengths = [], [], 0, []

    def wait():
        deadline = time.monotonic() + cfg.env.reset_timeout
        while not env.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench sims: env.name={cfg.env.name} gave no result in {cfg.env.reset_timeout:.0f}s")
            time.sleep(0.0002)
        return env.result()

    try:
        for ep in range(episodes):
            t0 = time.perf_counter()
            env.start_reset(ep)
            wait()
            resets.append(time.perf_counter() - t0)
            t = 0
            while t < cfg.env.horizon:
                env.start_step(None if expert else rng.uniform(-1, 1, (1, chunk, dim)).astype(np.float32))
                out = wait()
                ran = max(int(out.env_steps[0]), 1)
                steps += [out.step_s / ran] * ran
                t += ran
                if out.terminated[0] or out.truncated[0]:
                    wins += bool(out.success[0])
                    lengths.append(t)
                    break
    finally:
        env.close()
    start, resets = resets[0], resets[1:] or resets   # the first reset also builds the env (and starts its process)
    p = lambda x, q: float(np.percentile(x, q)) * 1e3  # noqa: E731
    return {"start_s": start, "step_p50_ms": p(steps, 50), "step_p99_ms": p(steps, 99), "reset_p50_ms": p(resets, 50),
            "reset_p99_ms": p(resets, 99), "expert": expert, "episodes": episodes, "successes": int(wins),
            "mean_steps": float(np.mean(lengths)) if lengths else None}


def run(a) -> int:
    """Per task: step and reset time (p50/p99) of one env with the configured render settings, and
    the scripted expert's success over `--episodes` seeded episodes."""
    from ..envs.base import child_env_vars
    from ..world import check_env

    child_env_vars()
    rows = []
    print(f"{'task':24s} {'cams':>4s} {'res':>4s} {'render':>6s} {'chunk':>5s} {'step p50 ms':>11s} {'step p99 ms':>11s} "
          f"{'reset p50 ms':>12s} {'reset p99 ms':>12s} {'start s':>7s} {'expert success':>14s} {'steps/ep':>8s}")
    chunks = [int(c) for c in a.chunks.split(",")]
    for task in sim_task_names(a.tasks):
        cfg = compose([*SIM_TASKS[task], *a.overrides])
        check_env(cfg)
        for chunk in [1] if steps_by_expert(cfg) else chunks:   # the expert acts one step at a time
            r = {"task": task, "cameras": len(cfg.env.cameras), "image_size": cfg.env.image_size,
                 "fast_render": cfg.env.fast_render, "chunk": chunk, **time_episodes(cfg, a.episodes, chunk)}
            rows.append(r)
            print_sim_row(r, a.episodes)
    save_rows(a.out, "sims.json", rows)
    return 0


def print_sim_row(r: dict, episodes: int) -> None:
    succ = f"{r['successes']}/{episodes}" if r["expert"] else "no expert"
    print(f"{r['task']:24s} {r['cameras']:4d} {r['image_size']:4d} {'fast' if r['fast_render'] else 'stock':>6s} "
          f"{r['chunk']:5d} {r['step_p50_ms']:11.1f} {r['step_p99_ms']:11.1f} {r['reset_p50_ms']:12.1f} {r['reset_p99_ms']:12.1f} "
          f"{r['start_s']:7.1f} {succ:>14s} {r['mean_steps'] or float('nan'):8.1f}", flush=True)


