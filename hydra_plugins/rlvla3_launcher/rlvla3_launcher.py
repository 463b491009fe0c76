"""`hydra/launcher=rlvla3_slurm` (conf/config.yaml selects it for every `-m` sweep): Slurm points as
one heterogeneous job each, submitted together; local points one after another, in this process.

Why every sweep: Hydra picks the launcher from the config composed *without* the sweep's own
overrides, so in `-m cluster=slurm_8,slurm_16` the launcher would be the default cluster's. Set
here for all, a sweep over cluster sizes submits each point as its het job, and a local sweep
(`-m algo.lr=1e-4,3e-4`) runs as before: each point handed to Hydra's basic launcher. A sweep that
mixes local and Slurm points is refused before anything runs.

What runs from hydra-submitit-launcher: `BaseSubmititLauncher.__init__` (the launcher's
parameters) and `setup` (Hydra's context, config and task function), which this class inherits;
and from Hydra, each point's sweep config (`load_sweep_config`), its folder
(`hydra.sweep.dir`/`hydra.sweep.subdir`) and its `JobReturn`. The library's `launch` cannot serve
and is replaced, for three reasons in its own code:
- it submits the sweep with `executor.map_array`, one Slurm job array; a heterogeneous job (a CPU
  component for the Simulators, a GPU component for Generators and Trainers) cannot be an array
  element;
- every array element runs `__call__`, i.e. Hydra's task function in one process, while every rank
  of an rlvla3 job must start as `python -m rlvla3.cluster.slurm` inside one MPI world (srun
  --het-group=0,1 --mpi=pmix);
- its resources are one queue's (`BaseQueueConf`: one partition, one gres, one task count), while
  a het job's two components have their own, from `cluster.*` and the site settings.
So `launch` here validates every point first (one bad point submits nothing), submits each as its
own het job through rlvla3.cluster.slurm (submitit's `SlurmExecutor`, extended for het blocks),
echoes the Trainers' progress lines while they run, and ends with one line per point and the
sweep's table (`<sweep dir>/sweep.md`).
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from omegaconf import OmegaConf, open_dict

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher

log = logging.getLogger(__name__)


@dataclass
class Rlvla3SlurmConf:
    _target_: str = "hydra_plugins.rlvla3_launcher.rlvla3_launcher.HetSlurmLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="rlvla3_slurm", node=Rlvla3SlurmConf, provider="rlvla3")


class HetSlurmLauncher(BaseSubmititLauncher):
    _EXECUTOR = "slurm"

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from rlvla3 import config
        from rlvla3.cluster import compose, results, slurm
        from rlvla3.world import derive

        on_slurm = [self.point_cluster(o) != "local" for o in job_overrides]
        if not any(on_slurm):
            return self.launch_here(job_overrides, initial_job_idx)
        if not all(on_slurm):
            local = [" ".join(o) for o, s in zip(job_overrides, on_slurm) if not s]
            raise config.ConfigError(f"this sweep mixes Slurm points with local ones ({'; '.join(local)}): sweep "
                                     f"cluster=local and the Slurm clusters in two commands")
        points = []
        for i, overrides in enumerate(job_overrides):
            sweep_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_cfg.hydra.job):
                sweep_cfg.hydra.job.num = initial_job_idx + i
            run_dir = Path(str(sweep_cfg.hydra.sweep.dir)) / str(sweep_cfg.hydra.sweep.subdir)
            body = OmegaConf.masked_copy(sweep_cfg, [k for k in sweep_cfg if k != "hydra"])
            try:
                cfg = config.to_config(body)
                derive(cfg)
            except config.ConfigError as e:
                raise config.ConfigError(f"sweep point #{initial_job_idx + i} ({' '.join(overrides)}): {e}") from e
            points.append((list(overrides), sweep_cfg, cfg, run_dir))

        if all(cfg.cluster.dry_run for _, _, cfg, _ in points):
            for overrides, sweep_cfg, cfg, run_dir in points:
                print(f"# dry run, sweep point #{sweep_cfg.hydra.job.num} ({' '.join(overrides)}) -> {run_dir}\n")
                print(slurm.dry_run_text(cfg, run_dir, job_name=f"rlvla3-{run_dir.name}"))
            return [JobReturn(overrides=o, cfg=c, working_dir=str(r), task_name="rlvla3", status=JobStatus.COMPLETED,
                              _return_value="dry run") for o, c, _, r in points]

        jobs = []
        for overrides, sweep_cfg, cfg, run_dir in points:
            cfg, _ = compose.prepare_run_dir(cfg, run_dir)
            job = slurm.submit(cfg, run_dir, job_name=f"rlvla3-{run_dir.name}")
            log.info(f"#{sweep_cfg.hydra.job.num} {' '.join(filter_overrides(overrides))}: het job {job.job_id} -> {run_dir}")
            jobs.append(job)

        # Every point's progress lines while any runs; then one line per point and the table.
        echoes = [slurm.ProgressEcho(job, prefix=f"#{sweep_cfg.hydra.job.num} ") for (_, sweep_cfg, _, _), job in zip(points, jobs)]

        def echo_all():
            for echo in echoes:
                echo()

        returns, rows = [], []
        for (overrides, sweep_cfg, cfg, run_dir), job in zip(points, jobs):
            ret = JobReturn(overrides=overrides, cfg=sweep_cfg, working_dir=str(run_dir), task_name="rlvla3")
            error = None
            try:
                slurm.wait(job, cfg.cluster.poll_s, on_poll=echo_all)
                ret.status, ret.return_value = JobStatus.COMPLETED, str(run_dir)
            except Exception as e:  # the job's own error (rank traceback) becomes the point's failure
                ret.status, ret.return_value, error = JobStatus.FAILED, e, e
            row = results.sweep_row(sweep_cfg.hydra.job.num, filter_overrides(overrides), run_dir, error)
            print(f"#{row['point']} {row['overrides']}: {row['status']}, {results.result_text(row)}; {run_dir}", flush=True)
            rows.append(row)
            returns.append(ret)
        sweep_dir = Path(str(points[0][1].hydra.sweep.dir))
        (sweep_dir / "sweep.md").write_text(results.sweep_table(rows) + "\n")
        print(f"sweep table: {sweep_dir / 'sweep.md'}", flush=True)
        return returns

    def point_cluster(self, overrides: Sequence[str]) -> str:
        """`cluster.name` of the sweep point with these overrides."""
        return str(self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides)).cluster.name)

    def launch_here(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Local points: one after another in this process, as Hydra's own basic launcher runs a sweep."""
        from hydra._internal.core_plugins.basic_launcher import BasicLauncher  # hydra-core is pinned (1.3.8)

        basic = BasicLauncher()
        basic.setup(hydra_context=self.hydra_context, task_function=self.task_function, config=self.config)
        return basic.launch(job_overrides, initial_job_idx)
