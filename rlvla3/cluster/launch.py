"""`python -m rlvla3.launch [overrides]`: compose the config (Hydra), validate it, write the run
folder, and start every rank of the run.

Config groups: env, policy, algo, mode, cluster (see conf/). `cluster=local` (the default) runs
all ranks on this machine through mpiexec. Any other cluster submits one Slurm heterogeneous job
(cluster/slurm.py) and waits for it. Every `-m` sweep goes through the project's Hydra launcher
plugin (hydra_plugins/rlvla3_launcher): Slurm points as one het job each, submitted together;
local points one after another, as Hydra's basic launcher runs them. `cluster.dry_run=true` prints the
batch file instead of submitting. A bad config fails here, before any rank starts or any job is
submitted, with a message naming the field.
"""
from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from .compose import CONF_DIR, check_previous_run, prepare_run_dir, register_schema
from .local import cpu_warning, mpi_env, mpiexec_command
from .results import failure_line, result_line


def run_slurm(cfg, run_dir: Path, job_name: str = "rlvla3") -> int:
    """Submit the run as one het job and wait for it; 0 on success. Logs are in run_dir/slurm/."""
    from ..world import gpu_ranks
    from . import slurm

    with refused_config():
        cfg, _ = prepare_run_dir(cfg, run_dir)
    job = slurm.submit(cfg, run_dir, job_name)
    print(f"submitted Slurm het job {job.job_id}: {cfg.cluster.sim_ranks} Simulator + "
          f"{gpu_ranks(cfg)} GPU ranks; logs in {run_dir / 'slurm'}", flush=True)
    t0 = time.time()
    try:
        slurm.wait(job, cfg.cluster.poll_s, on_poll=slurm.ProgressEcho(job))   # the Trainer's lines, as they come
    except Exception as e:  # submitit's UncompletedJobError / FailedJobError, with the rank's traceback
        print(f"Slurm job {job.job_id} FAILED after {time.time() - t0:.0f}s: {e}", file=sys.stderr, flush=True)
        first = failure_line(run_dir)
        if first:
            print(first, file=sys.stderr, flush=True)
        return 1
    print(f"Slurm job {job.job_id} finished in {time.time() - t0:.1f}s", flush=True)
    print(result_line(run_dir), flush=True)
    return 0


def _main(dcfg) -> None:
    """Hydra's task function: one run, or one point of a `-m` sweep. A run exits with its status;
    a sweep point returns (a failed one raises), so the sweep goes on to its next point."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    rc = launch_one(dcfg)
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        sys.exit(rc)
    if rc != 0:
        raise RuntimeError(f"sweep point {HydraConfig.get().job.num} failed (exit {rc}); its run folder says why")


def launch_one(dcfg) -> int:
    """Compose, check and start one run (locally, or as a Slurm het job); its exit status."""
    from hydra.core.hydra_config import HydraConfig

    from .. import config, notices
    from ..engine.lock import check_free
    from ..world import derive, plan_table

    with refused_config():
        cfg = config.to_config(dcfg)
        run_dir = Path(cfg.run_dir or HydraConfig.get().runtime.output_dir)
        world = derive(cfg)
        check_free(run_dir)   # another job's run folder: refused before anything starts
        check_previous_run(cfg, run_dir)   # a finished run's folder, without resume=true: likewise
    print(describe(cfg, world, run_dir), flush=True)
    if cfg.cluster.name != "local":
        from . import slurm
        print(plan_table(world))
        if cfg.cluster.dry_run:
            print(f"# dry run (cluster.dry_run=true): the batch file for {run_dir}\n")
            print(slurm.dry_run_text(cfg, run_dir))
            return 0
        return run_slurm(cfg, run_dir)
    if cfg.cluster.dry_run:   # nothing written, nothing started: what would run
        print(f"# dry run (cluster.dry_run=true): the command for {run_dir}\n")
        print(" ".join(mpiexec_command(cfg, world.size, run_dir)))
        return 0
    with refused_config():   # the env's own packages check its task and cameras here
        cfg, world = prepare_run_dir(cfg, run_dir)   # rank 0 prints the plan table
    warn = cpu_warning(cfg, world)
    if warn:
        print(warn)
    cmd = mpiexec_command(cfg, world.size, run_dir)
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    rc = notices.run_to_console(cmd, mpi_env(), cfg.runtime.max_wall)
    kept = notices.summary(run_dir)
    if kept:
        print(kept)
    print(f"{'finished' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - t0:.1f}s; run folder: {run_dir}")
    last = result_line(run_dir) if rc == 0 else failure_line(run_dir)
    if last:   # a failed job: the first error a rank raised, not MPI's abort banner above it
        print(last, flush=True)
    return rc


@contextlib.contextmanager
def refused_config():
    """A bad value ends the launcher here, in one line naming it, before any rank starts."""
    from ..config import ConfigError
    from ..engine.lock import RunFolderBusy

    try:
        yield
    except (ConfigError, RunFolderBusy) as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)


def describe(cfg, world, run_dir: Path) -> str:
    """The run in a few lines, first on the console: what it trains, how, on which ranks, where."""
    from ..world import success_hint

    e, p, a, m = cfg.env, cfg.policy, cfg.algo, cfg.mode
    task = {"libero": f" {e.suite} tasks {e.task_ids}", "toy": "", "emulated": ""}.get(e.name, f" {e.task}")
    weights = f"from {p.pretrained}" + (f", LoRA rank {p.lora_rank}" if p.lora_rank else ", full fine-tuning") \
        if p.pretrained else "random init" + (f", from {p.init_from}" if p.init_from else "")
    mode = f"{m.name} (eta {m.eta}, {m.placement})" if m.name == "async" else f"{m.name} ({m.placement})"
    return "\n".join([
        f"rlvla3: {a.name} on {e.name}{task} ({e.num_envs} envs, horizon {e.horizon}), policy {p.name} "
        f"(chunk {p.chunk}, {weights}), {mode}",
        f"ranks: {len(world.sim_ranks)} Simulator, {len(world.gen_ranks)} Generator, {len(world.train_ranks)} Trainer "
        f"on {cfg.cluster.name}; {a.max_versions} versions of {a.rollout_batch} rows; run folder {run_dir}",
        "success = the share of the version's finished episodes that reached the task's goal (0 to 1)",
        *success_hint(cfg), *held_out(cfg)])


def held_out(cfg) -> list[str]:
    """The line about evaluation while training (runtime.eval_every), if any."""
    r = cfg.runtime
    if not r.eval_every:
        return []
    return [f"held-out evaluation: every {r.eval_every} versions and the last, {r.eval_episodes} episodes on "
            f"{r.eval_envs} envs of its own (seeds from {r.eval_seed}), beside training; the best kept as ckpt/best.pt"]


def main() -> None:
    import hydra

    register_schema()
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
