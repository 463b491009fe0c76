"""`python -m rlvla3.launch [overrides]`: compose the config (Hydra), validate it, write the run
folder, and start every rank of the run.

Config groups: env, policy, algo, mode, cluster (see conf/). `cluster=local` (the default) runs
all ranks on this machine through mpiexec. Any other cluster submits one Slurm heterogeneous job
(rlvla3/slurm.py) and waits for it; `-m` sweeps go through the project's Hydra launcher plugin
(hydra_plugins/rlvla3_launcher), one het job per sweep point. `cluster.dry_run=true` prints the
batch file instead of submitting. A bad config fails here, before any rank starts or any job is
submitted, with a message naming the field.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from .config import RunConfig

    # The dataclasses are frozen (role code must not mutate config), which makes their OmegaConf
    # nodes read-only, while Hydra composes by merging into the schema. So Hydra gets the schema's
    # keys and defaults in struct mode (unknown keys fail at compose); `to_config` then checks
    # types against the dataclasses.
    node = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(RunConfig)))
    OmegaConf.set_struct(node, True)
    ConfigStore.instance().store(name="rlvla3_schema", node=node)


def compose(overrides: list[str] | None = None):
    """RunConfig from conf/ plus Hydra-style overrides, without starting anything (tests, bench)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    from .config import to_config

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(hydra_compose(config_name="config", overrides=list(overrides or [])))


def mpiexec_command(cfg, world_size: int, run_dir: Path) -> list[str]:
    c = cfg.cluster
    cmd = [c.mpiexec, *c.mpiexec_args]
    if os.geteuid() == 0 and "--allow-run-as-root" not in cmd:
        cmd.append("--allow-run-as-root")
    return [*cmd, "-n", str(world_size), sys.executable, "-m", "mpi4py", "-m", "rlvla3.run", str(run_dir)]


def mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")   # idle ranks yield the core
    env.setdefault("THP_MEM_ALLOC_ENABLE", "1")           # fast large tensor <-> numpy copies
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def cpu_warning(cfg, d) -> str | None:
    """Ranks + env child processes vs cores: oversubscription makes every number noisy."""
    cores = cfg.cluster.cores or os.cpu_count() or 1
    children = 0 if (cfg.env.in_process or cfg.env.name in ("toy", "emulated")) else cfg.env.num_envs
    busy = d.world_size + children
    if busy > cores:
        return (f"warning: {d.world_size} ranks + {children} env processes on {cores} cores "
                f"(oversubscribed: throughput is shared, not parallel)")
    return None


def prepare_run_dir(cfg, run_dir: Path):
    """Validate, then write the run folder (resolved config). Returns (cfg, derived)."""
    from . import config, shards

    d = config.derive(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = config.replace(cfg, run_dir=str(run_dir))
    if cfg.resume:
        shards.clean_partial(run_dir / "shards")  # temporaries of writers that died
    config.save(cfg, run_dir)
    return cfg, d


def run_local(cfg, run_dir: Path, timeout: float | None = None, capture: bool = False) -> subprocess.CompletedProcess:
    """Run every rank through mpiexec on this machine; returns when the job ends."""
    cfg, d = prepare_run_dir(cfg, Path(run_dir))
    cmd = mpiexec_command(cfg, d.world_size, Path(run_dir))
    kw = {"capture_output": True, "text": True} if capture else {}
    return subprocess.run(cmd, env=mpi_env(), timeout=timeout, **kw)


def run_slurm(cfg, run_dir: Path, job_name: str = "rlvla3") -> int:
    """Submit the run as one het job and wait for it; 0 on success. Logs are in run_dir/slurm/."""
    from . import config, slurm

    cfg, d = prepare_run_dir(cfg, run_dir)
    job = slurm.submit(cfg, run_dir, job_name)
    print(f"submitted Slurm het job {job.job_id}: {cfg.cluster.sim_ranks} Simulator + "
          f"{config.gpu_ranks(cfg)} GPU ranks; logs in {run_dir / 'slurm'}", flush=True)
    t0 = time.time()
    try:
        slurm.wait(job, cfg.cluster.poll_s)
    except Exception as e:  # submitit's UncompletedJobError / FailedJobError, with the rank's traceback
        print(f"Slurm job {job.job_id} FAILED after {time.time() - t0:.0f}s: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"Slurm job {job.job_id} finished in {time.time() - t0:.1f}s; run folder: {run_dir}", flush=True)
    return 0


def _main(dcfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from . import config

    try:
        cfg = config.to_config(dcfg)
        run_dir = Path(cfg.run_dir or HydraConfig.get().runtime.output_dir)
        d = config.derive(cfg)
    except config.ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    if cfg.cluster.name != "local":
        from . import slurm
        print(config.plan_table(cfg, d))
        if cfg.cluster.dry_run:
            print(f"# dry run (cluster.dry_run=true): the batch file for {run_dir}\n")
            print(slurm.dry_run_text(cfg, run_dir))
            sys.exit(0)
        sys.exit(run_slurm(cfg, run_dir))
    cfg, d = prepare_run_dir(cfg, run_dir)
    print(f"run folder: {run_dir}")
    print(config.plan_table(cfg, d))
    warn = cpu_warning(cfg, d)
    if warn:
        print(warn)
    cmd = mpiexec_command(cfg, d.world_size, run_dir)
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    rc = subprocess.run(cmd, env=mpi_env(), timeout=cfg.runtime.max_wall).returncode
    print(f"{'finished' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - t0:.1f}s; run folder: {run_dir}")
    sys.exit(rc)


def main() -> None:
    import hydra

    register_schema()
    hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_main)()


if __name__ == "__main__":
    main()
