"""Where Trainer rank 0's per-version scalars go besides metrics/ (which always holds them):
TensorBoard (runtime.tensorboard) and Weights & Biases (runtime.wandb). Both get every scalar
against the version and against the env steps so far, and the resolved config once; held-out
evaluations (runtime.eval_every) as eval/* against the version they evaluated.

A resumed run continues the same W&B run: its id is kept in <run>/wandb_id.txt, and the
versions it had logged are not logged twice (W&B refuses steps that go backwards).
"""
from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path


class ScalarSinks:
    def __init__(self, cfg, run_dir: Path, history: list[dict]):
        """history: the versions a resumed run already has (the env-step axis continues from them)."""
        self.tb = self.wb = None
        self.env_steps = sum(int(h.get("env_steps", 0)) for h in history)
        if cfg.runtime.tensorboard and cfg.policy.name != "emulated":
            # TensorBoard's writer comes with torch, which emulated ranks never import (the
            # metrics files hold the same scalars).
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tb"))
            resolved = run_dir / "config.yaml"   # what the launcher wrote
            if resolved.is_file():
                self.tb.add_text("config", "```\n" + resolved.read_text() + "\n```")
        if cfg.runtime.wandb:
            self.wb = start_wandb(cfg, run_dir)

    def log(self, rec: dict, version: int) -> None:
        """One version's scalars (`rec` holds this version's env_steps)."""
        self.env_steps += int(rec.get("env_steps", 0))
        if self.tb is not None:
            for key, v in rec.items():
                self.tb.add_scalar(key, v, version)
                self.tb.add_scalar(f"by_env_steps/{key}", v, self.env_steps)
        if self.wb is not None and version > self.wb.summary.get("version", 0):
            self.wb.log({**rec, "version": version, "env_steps_total": self.env_steps})

    def log_eval(self, res: dict, version: int, env_steps: int) -> None:
        """A held-out evaluation of `version` (engine/evaluator.py), which ends while later versions
        train: eval/* scalars against that version (and its env steps), its videos to W&B (the
        evaluation process put them in TensorBoard itself)."""
        scalars = {f"eval/{k}": res[k] for k in ("success", "success_lo", "success_hi", "episodes")}
        if self.tb is not None:
            for key, v in scalars.items():
                self.tb.add_scalar(key, v, version)
                self.tb.add_scalar(f"by_env_steps/{key}", v, env_steps)
            self.tb.flush()
        if self.wb is not None:
            import wandb

            media = {f"eval_videos/{p.stem}": wandb.Video(str(p), format="mp4") for p in res["videos"]}
            # Its own x-axis: "version" stays the newest trained version (a resume reads it back).
            self.wb.log({**scalars, **media, "eval/version": version})

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wb is not None:
            self.wb.finish()


def start_wandb(cfg, run_dir: Path):
    """wandb.init for this run folder (the same W&B run again after a resume)."""
    import wandb

    id_file = run_dir / "wandb_id.txt"
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:16])
    r = cfg.runtime
    run = wandb.init(project=r.wandb_project, entity=r.wandb_entity or None, name=r.wandb_name or run_dir.name,
                     id=id_file.read_text().strip(), resume="allow", mode=r.wandb_mode, dir=str(run_dir),
                     config=dataclasses.asdict(cfg))
    run.define_metric("version")
    run.define_metric("env_steps_total")
    run.define_metric("eval/version")
    run.define_metric("eval/*", step_metric="eval/version")
    run.define_metric("eval_videos/*", step_metric="eval/version")
    run.define_metric("*", step_metric="version")
    return run
