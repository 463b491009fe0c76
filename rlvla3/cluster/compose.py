"""A run's config composed with Hydra from conf/ (the schema underneath), and its run folder.

`compose(overrides)` gives the `RunConfig` a launch with those overrides would run, without
starting anything (tools, tests, benchmarks); `prepare_run_dir` validates it (`world.derive`)
and writes the run folder every rank reads.
"""
from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]   # the checkout: conf/ and slurm/ live beside the package
CONF_DIR = REPO / "conf"


def register_schema() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from ..config import RunConfig

    # The dataclasses are frozen (role code must not mutate config), which makes their OmegaConf
    # nodes read-only, while Hydra composes by merging into the schema. So Hydra gets the schema's
    # keys and defaults in struct mode (unknown keys fail at compose); `to_config` then checks
    # types against the dataclasses.
    node = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(RunConfig)))
    OmegaConf.set_struct(node, True)
    ConfigStore.instance().store(name="rlvla3_schema", node=node)


def compose(overrides: list[str] | None = None):
    """RunConfig from conf/ plus Hydra-style overrides, without starting anything (tests, bench)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ..config import to_config

    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(hydra_compose(config_name="config", overrides=list(overrides or [])))


def previous_run(run_dir: Path) -> list[str]:
    """What a run folder already holds of a run (published shards, checkpoints): a new run there
    would mix its data with that one's (and waited for versions it would never see)."""
    from ..engine import checkpoints, shards

    held = []
    if (run_dir / "shards").is_dir() and (n := len(shards.scan(run_dir / "shards"))):
        held.append(f"{n} shards")
    if n := len(checkpoints.all_ckpts(run_dir / "ckpt")):
        held.append(f"{n} checkpoints")
    return held


def check_previous_run(cfg, run_dir: Path) -> None:
    """A new run (not resume=true) refuses a folder that holds another run's data; a resumed one,
    checkpoints its Trainers cannot read."""
    from ..config import ConfigError

    previous = [] if cfg.resume else previous_run(Path(run_dir))
    if previous:
        raise ConfigError(f"run_dir={str(run_dir)!r} holds a previous run ({', '.join(previous)}): add resume=true to "
                          "continue it, or give a new run_dir (nothing in it was changed)")
    check_resume_format(cfg, run_dir)


def check_resume_format(cfg, run_dir: Path) -> None:
    """resume=true: the newest checkpoint is the kind this config's Trainers read, a folder of
    FSDP shards for policy.data_parallel=fsdp, one file otherwise (whatever the Trainer count)."""
    from ..config import ConfigError
    from ..engine import checkpoints

    done = checkpoints.all_ckpts(Path(run_dir) / "ckpt") if cfg.resume and cfg.policy.name != "emulated" else []
    if done and checkpoints.is_sharded(done[-1]) != (cfg.policy.data_parallel == "fsdp"):
        was = "fsdp" if checkpoints.is_sharded(done[-1]) else "replicate"
        raise ConfigError(f"resume=true: {done[-1]} was written with policy.data_parallel={was}, and this run has "
                          f"policy.data_parallel={cfg.policy.data_parallel}: resume with policy.data_parallel={was} "
                          "(any Trainer count)")


def prepare_run_dir(cfg, run_dir: Path):
    """Validate, then write the run folder (resolved config). Returns (cfg, world)."""
    from .. import config
    from ..config import ConfigError
    from ..engine import shards
    from ..engine.lock import RunFolderBusy, check_free
    from ..world import check_env, derive

    world = derive(cfg)
    check_env(cfg)
    try:
        check_free(run_dir)
    except RunFolderBusy as e:
        raise ConfigError(f"run_dir={str(run_dir)!r}: {e}") from None
    check_previous_run(cfg, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = config.replace(cfg, run_dir=str(run_dir))
    if cfg.resume:
        shards.clean_partial(run_dir / "shards")  # temporaries of writers that died
    config.save(cfg, run_dir)
    write_run_records(cfg, run_dir)
    return cfg, world


def write_run_records(cfg, run_dir: Path) -> None:
    """The files a run folder keeps about its env beside the config (world.run_records: LIBERO's
    init_states.json), for runs and demonstration collections alike."""
    from ..world import run_records

    for name, record in run_records(cfg).items():
        (run_dir / name).write_text(json.dumps(record, indent=1))
