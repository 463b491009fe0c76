"""`python -m rlvla3.bench throughput [--env emulated|robosuite|toy|libero|maniskill] [--ladder] [overrides...]`
   `python -m rlvla3.bench weights [--params 1e6,1e7,1e8] [--generators 1,4,16]`
   `python -m rlvla3.bench families [--batches 1,8,32] [--families tiny,openvla,...] [--size tiny|published] [overrides...]`
   `python -m rlvla3.bench memory [--families openvla,openvla_oft,pi0,pi05] [--copies 1]`   (tools/bench_memory.py)
   `python -m rlvla3.bench faults [--minutes 10] [--seed 0] [overrides...]`   (tools/bench_faults.py)
   `python -m rlvla3.bench fidelity [--suite libero_spatial] [--tasks 0,5] [--control]`   (tools/libero_fidelity.py)
   `python -m rlvla3.bench obs [overrides...]`   (tools/bench_obs.py: observation compression)
   `python -m rlvla3.bench latency [--topologies 1+1,16+4] [--wakes doorbell,doorbell+expect,...]`   (tools/bench_latency.py)
   `python -m rlvla3.bench sims [--tasks Lift,...,pick-place-v3,...,libero,maniskill_PickCube] [--episodes 10] [overrides...]`

Runs the same workload in several modes back to back, in one process, and prints for each:
steady-state env steps/s (versions after the first), the ratio to the best sync baseline,
pipeline efficiency (achieved / the slowest stage's measured capacity), and CPU-seconds per
role. `--ladder` measures the paper's ablation: sync colocated and disaggregated, then
+overlap, +dynamic batching (env-level), +streaming (eta = 0), then eta = 1 and eta = 2.

The default workload is the emulated simulator with heavy-tailed step latency and slow resets
(no CPU spent simulating, so the numbers measure the runtime, not this machine's cores).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from ..cluster.compose import compose
from ..cluster.local import cpu_warning, run_local
from ..engine.metrics import read_summaries, steady_throughput
from ..world import derive, sharding_plan

WORKLOADS = {
    "emulated": ["env=emulated", "env.num_envs=16", "cluster.sim_ranks=2", "sharding.groups_per_rank=4", "algo.segment_steps=16",
                 "algo.rollout_batch=256", "algo.global_batch=128", "algo.micro_batch=64", "algo.max_versions=6",
                 "policy.patch=8", "generator.b_max=16", "generator.t_max_ms=5"],
    "robosuite": ["env=robosuite_lift", "env.num_envs=2", "algo.segment_steps=16", "algo.rollout_batch=64",
                  "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5", "sharding.groups_per_rank=2",
                  "generator.b_max=2"],
    # Paper-shaped: real robosuite envs, the Generator and Trainer emulated with a pi0.5-on-H100-like
    # profile (a forward ~28 ms at batch 1 + 3 ms a sample, 89 training samples/s, 0.2 s to publish).
    # 4 envs in 2 groups of 2 and a 20 ms window: a sample batched costs 3 ms against 31 ms alone, so
    # the Generator batches as a pi0.5 server would (with 2 envs it served batches of 1: 1.3x at most).
    "robosuite_pi05": ["env=robosuite_lift", "env.num_envs=4", "algo.segment_steps=16", "algo.rollout_batch=64",
                       "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5", "sharding.groups_per_rank=2",
                       "generator.b_max=4", "generator.t_max_ms=20", "policy=emulated", "policy.infer_fixed_ms=28",
                       "policy.infer_per_sample_ms=3", "policy.train_samples_per_s=89", "policy.weight_sync_ms=200"],
    "toy": ["+experiment=toy", "algo.max_versions=6", "algo.update_epochs=1"],
    # ManiSkill3 PickCube under .venv-maniskill (one env a process: its CPU backend), 2 envs at 64x64.
    "maniskill": ["env=maniskill", "env.num_envs=2", "policy=tiny", "policy.patch=8", "algo.segment_steps=16",
                  "algo.rollout_batch=64", "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5",
                  "sharding.groups_per_rank=2", "generator.b_max=2"],
    # LIBERO's real scenes under .venv-libero (libero_spatial tasks 0-3, both cameras at 64x64).
    "libero": ["env=libero", "env.task_ids=[0,1,2,3]", "env.num_envs=4", "env.image_size=64", "policy=tiny",
               "policy.patch=16", "sharding.groups_per_rank=2", "algo.segment_steps=8", "algo.rollout_batch=32",
               "algo.global_batch=32", "algo.micro_batch=32", "algo.max_versions=5", "generator.b_max=4"],
}

SYNC = ["mode=sync"]
RUNGS_BASIC = [
    ("sync colocated", [*SYNC, "mode.placement=colocated"]),
    ("sync disaggregated", SYNC),
    ("async eta=1", ["mode=async", "mode.eta=1"]),
]
RUNGS_LADDER = [
    ("sync colocated", [*SYNC, "mode.placement=colocated"]),
    ("sync disaggregated", SYNC),
    ("+overlap", [*SYNC, "mode.overlap=true"]),
    ("+dynamic batching", [*SYNC, "mode.overlap=true", "mode.env_level=true"]),
    ("+streaming (eta=0)", ["mode=async", "mode.eta=0"]),
    ("eta=1", ["mode=async", "mode.eta=1"]),
    ("eta=2", ["mode=async", "mode.eta=2"]),
]


def read_metrics(run: Path) -> tuple[dict, dict]:
    """(cpu seconds per role, span totals per name summed over ranks)."""
    cpu, spans = defaultdict(float), defaultdict(lambda: [0, 0.0])
    for rec in read_summaries(run):
        cpu[rec["role"]] += rec["cpu_s"] + rec["cpu_children_s"]
        for name, (n, s) in rec["spans"].items():
            spans[name][0] += n
            spans[name][1] += s
    return dict(cpu), dict(spans)


def stage_capacities(cfg, spans: dict, history: list[dict]) -> dict[str, float]:
    """Samples/s each stage could sustain alone, from measured busy time."""
    out = {}
    rows = sum(h["env_steps"] for h in history)
    if spans.get("infer", [0, 0])[1] > 0:
        samples = rows * (1 + 1 / cfg.algo.segment_steps)  # + bootstrap requests
        out["generator"] = samples / spans["infer"][1] * cfg.cluster.gen_ranks
    if spans.get("train", [0, 0])[1] > 0:
        out["trainer"] = rows * cfg.algo.update_epochs / spans["train"][1] * cfg.cluster.train_ranks
    e = cfg.env
    if e.name == "emulated":
        import math

        per_step = e.step_ms / 1e3 * math.exp(e.step_sigma ** 2 / 2) + e.reset_ms / 1e3 / e.horizon
        out["simulator"] = e.num_envs / per_step
    elif spans.get("sim_step", [0, 0])[0]:
        n, s = spans["sim_step"]
        per_step = s / n + spans.get("reset", [0, 0.0])[1] / max(rows, 1)
        cores = cfg.cluster.cores or os.cpu_count() or 1
        out["simulator"] = min(e.num_envs, cores) / per_step if sharding_plan(cfg) else float("nan")
    return out


def measure(label: str, overrides: list[str], root: Path, timeout: float) -> dict:
    cfg = compose([*overrides, "runtime.tensorboard=false", "runtime.progress=false"])
    run = root / label.replace(" ", "_").replace("+", "p").replace("(", "").replace(")", "").replace("=", "")
    proc = run_local(cfg, run, timeout=timeout, capture=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{label}: run failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
    summary = json.loads((run / "summary.json").read_text())
    cpu, spans = read_metrics(run)
    thr = steady_throughput(summary["history"])
    caps = stage_capacities(cfg, spans, summary["history"])
    slowest = min(caps.values()) if caps else float("nan")
    return {"label": label, "steps_per_s": thr, "capacity": caps, "efficiency": thr / slowest,
            "cpu_s": cpu, "run": str(run), "warning": cpu_warning(cfg, derive(cfg))}


def report(results: list[dict]) -> str:
    sync = [r for r in results if r["label"].startswith("sync")]
    best = max(sync, key=lambda r: r["steps_per_s"]) if sync else results[0]
    lines = [f"{'configuration':24s} {'steps/s':>9s} {'vs best sync':>13s} {'pipeline eff.':>14s}  "
             f"CPU-s per role (bottleneck capacities, samples/s)"]
    for r in results:
        cpu = " ".join(f"{k}={v:.1f}" for k, v in sorted(r["cpu_s"].items()))
        caps = " ".join(f"{k}={v:.0f}" for k, v in sorted(r["capacity"].items()))
        lines.append(f"{r['label']:24s} {r['steps_per_s']:9.1f} {r['steps_per_s'] / best['steps_per_s']:12.2f}x "
                     f"{r['efficiency']:13.0%}  {cpu} ({caps})")
    asyncs = [r for r in results if not r["label"].startswith("sync")]
    if asyncs:
        top = max(asyncs, key=lambda r: r["steps_per_s"])
        lines.append(f"headline: {top['label']} / best sync ({best['label']}) = "
                     f"{top['steps_per_s'] / best['steps_per_s']:.2f}x ({(top['steps_per_s'] / best['steps_per_s'] - 1):+.1%})")
    warnings = {r["warning"] for r in results if r["warning"]}
    lines += sorted(warnings)
    return "\n".join(lines)


def save_rows(out: str, name: str, rows: list[dict]) -> None:
    """A benchmark's rows as JSON in --out (nothing without --out)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(rows, indent=1))


def weights_bench(a) -> int:
    """Publish cost (encode, bucketed MPI transfer to every Generator, decode) vs parameter count
    and Generator count, one mpiexec job per Generator count (tools/bench_weights.py)."""
    import subprocess

    from ..cluster.local import mpi_env

    rows = []
    print(f"{'params':>10s} {'gens':>5s} {'fanout':>6s} {'wire':9s} {'MiB/gen':>8s} {'seconds':>8s} {'GB/s in':>8s} "
          f"{'max rel err':>11s}")
    for g, fanout in ((int(x), int(f)) for x in a.generators.split(",") for f in a.fanouts.split(",")):
        if g == 1 and fanout != int(a.fanouts.split(",")[0]):
            continue   # one Generator: every fanout is the same single send
        cmd = ["mpiexec", "--oversubscribe", "-n", str(g + 1), sys.executable, "-m", "mpi4py", "-m", "rlvla3.tools.bench_weights",
               a.params, a.dtypes, str(a.bucket_mb), "3", str(fanout)]
        if os.geteuid() == 0:
            cmd.insert(1, "--allow-run-as-root")
        out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=a.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"weights bench with {g} Generators failed:\n{out.stderr[-3000:]}")
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                rows.append(r)
                gbps = r["bytes_per_generator"] * r["generators"] / r["seconds"] / 1e9
                print(f"{r['params']:10.0e} {r['generators']:5d} {r['fanout']:6d} {r['dtype']:9s} {r['bytes_per_generator'] / 2**20:8.1f} "
                      f"{r['seconds']:8.3f} {gbps:8.2f} {r['max_rel_error']:11.2e}", flush=True)
    print(broadcast_check(rows, a.bucket_mb))
    save_rows(a.out, "weights.json", rows)
    return 0


def broadcast_check(rows: list[dict], bucket_mb: float) -> str:
    """The planner's broadcast term (planner/network.py) against the measured publishes. Two
    numbers of the site are fitted per size and wire, the rest predicted: the link bandwidth from
    the 1-Generator publish (bytes / seconds), and the bisection (how much all copies together
    move: on one node each copy takes a core) from the smallest flat (fanout 0) publish to several
    Generators, marked. On one node a flat publish is pulled by its receivers in parallel (no
    sender NIC), which the model, written for a cluster, does not have."""
    import dataclasses

    from ..cluster.compose import CONF_DIR
    from ..planner.network import broadcast_ms
    from ..planner.profile import load_profile

    base = load_profile(CONF_DIR / "profile/emulated_validation.yaml")
    lines = ["planner broadcast model (link bandwidth from the 1-Generator row, bisection from the first flat row):",
             f"{'params':>10s} {'gens':>5s} {'fanout':>6s} {'wire':9s} {'measured s':>10s} {'model s':>8s} {'error':>7s}"]
    for key in dict.fromkeys((r["params"], r["dtype"]) for r in rows):
        same = [r for r in rows if (r["params"], r["dtype"]) == key]
        one = next((r for r in same if r["generators"] == 1), None)
        flat = min((r for r in same if r["generators"] > 1 and r["fanout"] == 0), key=lambda r: r["generators"], default=None)
        if one is None or flat is None:
            continue
        size = one["bytes_per_generator"]
        prof = dataclasses.replace(base, weights_mb=size / 1e6, net_gbps=size / one["seconds"] / 1e9,
                                   net_bisection_gbps=flat["generators"] * size / flat["seconds"] / 1e9)
        for r in same:
            if r["generators"] == 1:
                continue
            r["model_seconds"] = broadcast_ms(prof, r["generators"], r["fanout"], bucket_mb * 2**20 / 1e6) / 1e3
            mark = "   (bisection fitted here)" if r is flat else ""
            lines.append(f"{r['params']:10.0e} {r['generators']:5d} {r['fanout']:6d} {r['dtype']:9s} {r['seconds']:10.3f} "
                         f"{r['model_seconds']:8.3f} {r['model_seconds'] / r['seconds'] - 1:+7.0%}{mark}")
    return "\n".join(lines)


# The benchmark's runs of each family (registry.FAMILIES) as a user selects them (conf/policy/*.yaml), on the env of the overrides.
RELEASED = "policy.pretrained={released}"
RELEASED_OFT = "policy.pretrained={released_oft}"
FAMILY_RUNS = {
    "tiny": ["policy=tiny"],
    "tiny_chunk4": ["policy=tiny", "policy.chunk=4"],
    "openvla_parallel": ["policy=openvla"],
    "openvla_autoregressive": ["policy=openvla", "policy.decoding=autoregressive"],
    "openvla_oft_chunk4": ["policy=openvla", "policy.chunk=4"],
    "pi0_chunk4": ["policy=pi0"],
    "pi05_chunk4": ["policy=pi05"],
    # a released OpenVLA folder (a tiny one in the published layout, written for the run)
    "openvla_released": ["policy=openvla", "policy.decoding=autoregressive", RELEASED],
    "openvla_released_oft_chunk8": ["policy=openvla", "policy.chunk=8", RELEASED],
    "openvla_oft_l1_chunk8": ["policy=openvla_oft", "policy.chunk=8", RELEASED_OFT],
}


def tiny_released_folder(cfg, oft: bool = False, folder: str = "") -> str:
    """A tiny OpenVLA (or OpenVLA-OFT) folder in the released layout whose statistics fit the env
    of `cfg` (the last action dim is the gripper, left un-normalised as in OpenVLA's datasets), in
    `folder` or a new temporary one."""
    import tempfile

    from ..envs import env_dims
    from ..policies import openvla_oft, prismatic

    dims = env_dims(cfg)
    d, p = dims.action_dim, dims.proprio_dim
    stats = {"bench": {"action": {"q01": [-1.0] * d, "q99": [1.0] * d, "mask": [True] * (d - 1) + [False]},
                       "proprio": {"q01": [-1.0] * p, "q99": [1.0] * p}}}
    folder = folder or tempfile.mkdtemp(prefix="openvla-released-")
    if oft:
        openvla_oft.write_tiny_folder(folder, stats, d, p)
    else:
        prismatic.write_tiny_folder(folder, stats)
    return folder


def chosen_families(arg: str, runs: dict) -> list[str]:
    """--families: a comma list of names in `runs` (empty: all of them); an unknown name stops the bench."""
    names = arg.split(",") if arg else list(runs)
    unknown = sorted(set(names) - set(runs))
    if unknown:
        raise SystemExit(f"--families {','.join(unknown)}: not one of {','.join(runs)}")
    return names


def families_bench(a) -> int:
    """Generator forward (`act`) and Trainer step (evaluate + PPO loss + backward + Adam) per
    policy family and batch size, one torch thread, medians of `--repeats` (after one warm-up)."""
    import numpy as np
    import torch

    from ..algo import decoupled_ppo_loss
    from ..policies import make_policy
    from ..policies.base import pick_device
    from ..policies.lora import trainable
    from ..policies.sampling import draw_noise
    from ..world import spec

    torch.set_num_threads(1)
    published = a.size == "published"
    if published:
        from .bench_memory import PUBLISHED_RUNS as runs
    else:
        runs = FAMILY_RUNS
    names = chosen_families(a.families, runs)
    rows = []
    folders = {"released": RELEASED, "released_oft": RELEASED_OFT}
    folders = {k: tiny_released_folder(compose(a.overrides), k == "released_oft") if any(o in runs[n] for n in names) else ""
               for k, o in folders.items()}
    print(f"{'family':28s} {'params':>9s} {'batch':>5s} {'act ms':>8s} {'train ms':>9s} {'act samples/s':>13s} {'peak GB':>8s}")
    for name in names:
        cfg = compose([*a.overrides, *(o.format(**folders) for o in runs[name])])
        sp = spec(cfg)
        device = pick_device(cfg.policy.device)
        if published and device.type != "cuda":
            raise SystemExit(f"--size published builds {name} at its released size (3.5-7.7 B parameters): it needs a GPU "
                             f"(policy.device={cfg.policy.device} gives {device}); on a CPU use the tiny families and "
                             "python -m rlvla3.bench memory")
        with torch.device(device):   # published: random weights made on the GPU, at the preset's LoRA and checkpointing
            policy = make_policy(cfg, sp, published=published).to(device).train()
        opt = torch.optim.Adam(trainable(policy), lr=1e-5)
        n_params = sum(p.numel() for p in policy.parameters())
        for b in (int(x) for x in a.batches.split(",")):
            rng = np.random.default_rng(0)
            obs = tuple(torch.from_numpy(x).to(device) for x in (
                rng.integers(0, 255, (b, sp.cameras, sp.image_size, sp.image_size, 3), dtype=np.uint8),
                rng.normal(size=(b, sp.proprio_dim)).astype(np.float32),
                rng.integers(2, sp.vocab, (b, sp.instruction_len)).astype(np.int32)))
            noise = torch.from_numpy(draw_noise(sp.sample, rng, b)).to(device)

            def act():
                with torch.no_grad():
                    return policy.act(*obs, noise)

            sample, logp_b, _ = act()

            def train():
                logp, ent, value = policy.evaluate(*obs, sample)
                z = torch.zeros(b, device=device)
                adv = torch.randn(b, device=device)
                decoupled_ppo_loss(logp, logp_b, logp_b, adv, value, z, ent, 0.2, 2.0, 0.5, 0.0).total.backward()
                opt.step()
                opt.zero_grad()

            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t_act, t_train = (median_seconds(f, a.repeats) for f in (act, train))
            peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")
            rows.append({"family": name, "size": a.size, "params": n_params, "batch": b, "act_s": t_act, "train_s": t_train,
                         "peak_gb": peak, "device": str(device)})
            print(f"{name:28s} {n_params / 1e6:8.2f}M {b:5d} {t_act * 1e3:8.1f} {t_train * 1e3:9.1f} {b / t_act:13.1f} "
                  f"{peak:8.1f}", flush=True)
    save_rows(a.out, "families.json" if not published else "families_published.json", rows)
    return 0


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

    import numpy as np

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


def sims_bench(a) -> int:
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


def median_seconds(fn, repeats: int) -> float:
    import time

    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()   # warm-up (allocations, lazy init)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def parser() -> argparse.ArgumentParser:
    """The options of every subcommand but fidelity, which has its own (tools/libero_fidelity.py)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["throughput", "weights", "families", "memory", "sims", "faults", "fidelity", "shards",
                                     "latency", "obs"])
    ap.add_argument("--minutes", type=float, default=10.0, help="faults: how long to inject faults")
    ap.add_argument("--seed", type=int, default=0, help="faults: the random choice of faults and moments")
    ap.add_argument("--tasks", default=",".join(t for t in SIM_TASKS if t not in LIBERO_TASKS),
                    help=f"sims: any of {', '.join(SIM_TASKS)}; libero = every LIBERO row")
    ap.add_argument("--episodes", type=int, default=10, help="sims: episodes per task")
    ap.add_argument("--chunks", default="1", help="sims: action chunk lengths of the random-action rows (a row each)")
    ap.add_argument("--batches", default="1,8,32", help="families: batch sizes")
    ap.add_argument("--families", default="", help=f"families: a comma list of {','.join(FAMILY_RUNS)} (default: all); "
                                                   "memory: of openvla,openvla_oft,pi0,pi05")
    ap.add_argument("--copies", type=int, default=1, help="memory: frozen copies of the trainable weights (π_prox, a KL reference)")
    ap.add_argument("--repeats", type=int, default=5, help="families, shards, obs: timed repeats per measurement (median)")
    ap.add_argument("--size", choices=["tiny", "published"], default="tiny",
                    help="families: tiny sizes (any device), or the released sizes as the LIBERO presets set them up (a GPU)")
    ap.add_argument("--params", default="1e6,1e7,1e8", help="weights: parameter counts")
    ap.add_argument("--generators", default="1,4,16", help="weights: Generator counts")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="weights: wire formats")
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
        from .libero_fidelity import main as fidelity

        return fidelity(argv[1:])
    a = parser().parse_intermixed_args(argv)  # overrides may follow options
    if a.what == "weights":
        return weights_bench(a)
    if a.what == "families":
        return families_bench(a)
    if a.what == "memory":
        from .bench_memory import PUBLISHED_RUNS, memory_bench
        save_rows(a.out, "memory.json", memory_bench(a, chosen_families(a.families, PUBLISHED_RUNS)))
        return 0
    if a.what == "sims":
        return sims_bench(a)
    if a.what == "shards":
        from .bench_shards import shards_bench
        save_rows(a.out, "shards.json", shards_bench(a))
        return 0
    if a.what == "obs":
        from .bench_obs import obs_bench
        save_rows(a.out, "obs.json", obs_bench(a))
        return 0
    if a.what == "latency":
        from .bench_latency import latency_bench
        save_rows(a.out, "latency.json", latency_bench(a))
        return 0
    if a.what == "faults":
        from .bench_faults import faults_bench
        return faults_bench(a)
    root = Path(a.out or tempfile.mkdtemp(prefix="rlvla3-bench-"))
    rungs = RUNGS_LADDER if a.ladder else RUNGS_BASIC
    results = []
    for label, mode in rungs:
        r = measure(label, [*WORKLOADS[a.env], *a.overrides, *mode], root, a.timeout)
        print(f"  {label:24s} {r['steps_per_s']:8.1f} steps/s", flush=True)
        results.append(r)
        (root / "bench.json").write_text(json.dumps(results, indent=1))  # kept if a later one fails
    text = report(results)
    print(f"\nworkload: {a.env} {' '.join(a.overrides)}\n{text}\nrun folders: {root}")
    (root / "bench.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
