"""Bad config fails early with the field named; every shipped config composes and validates."""
import pytest

from rlvla3.cluster.compose import CONF_DIR, compose
from rlvla3.config import ConfigError
from rlvla3.world import derive, sharding_plan


@pytest.mark.parametrize("override, field", [
    ("algo.rollout_batch=100", "algo.rollout_batch"),
    ("algo.global_batch=7", "algo.global_batch"),
    ("algo.micro_batch=1000", "algo.micro_batch"),
    ("env.name=nope", "env.name"),
    ("mode.placement=sideways", "mode.placement"),
    ("cluster.sim_ranks=17", "sharding.plan"),
    ("generator.b_max=1", "sharding.plan"),
    ("policy.device=tpu", "policy.device"),
    ("mode.eta=-1", "mode.eta"),
    # values that used to pass validation and fail later, inside a rank (or as a bare ZeroDivisionError)
    ("runtime.ckpt_every=0", "runtime.ckpt_every"),
    ("policy.patch=0", "policy.patch"),
    ("policy.heads=0", "policy.heads"),
    ("env.image_size=0", "env.image_size"),
    ("env.image_size=-8", "env.image_size"),
    ("policy.vocab=2", "policy.vocab"),
    ("policy.instruction_len=0", "policy.instruction_len"),
    ("algo.clip=-0.5", "algo.clip"),
    ("algo.lr=-1.0", "algo.lr"),
    ("runtime.startup_timeout=0", "runtime.startup_timeout"),
    ("env.max_failed_starts=-1", "env.max_failed_starts"),
    ("env.reset_timeout=0", "env.reset_timeout"),
    ("env.start_timeout=-1", "env.start_timeout"),
    ("policy.init_from=/nonexistent.pt", "policy.init_from"),
    ("policy.pretrained=/nonexistent", "policy.pretrained"),
    ("policy.lora_rank=-1", "policy.lora_rank"),
    ("policy.flow_start_std=1.5", "policy.flow_start_std"),
    ("runtime.wandb_mode=onlin", "runtime.wandb_mode"),
    ("algo.ratio=tokens", "algo.ratio"),
    ("generator.greedy=true", "generator.greedy"),
    ("policy.discrete_state_input=false", "policy.discrete_state_input"),   # toy's tiny VLA reads a proprio token
    ("policy.data_parallel=zero3", "policy.data_parallel"),
    ("policy.compute_dtype=bfloat16", "policy.compute_dtype"),   # bf16 needs FSDP's mixed precision
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        derive(compose(["+experiment=toy", override]))


@pytest.mark.parametrize("algo", ["grpo", "raft"])
@pytest.mark.parametrize("override, says", [
    ("algo.vf_coef=0.5", "has no critic"),
    ("algo.segment_steps=5", "uses whole episodes"),
])
def test_outcome_algorithms_need_whole_episodes_and_no_critic(algo, override, says):
    """grpo and raft learn from whole episodes' outcomes: a segment shorter than an episode or a
    value loss with no critic to train is refused, naming the algorithm."""
    derive(compose(["+experiment=toy", f"algo={algo}", "algo.segment_steps=6", "algo.rollout_batch=192"]))   # fine
    with pytest.raises(ConfigError, match=f"{algo} {says}"):
        derive(compose(["+experiment=toy", f"algo={algo}", "algo.segment_steps=6", "algo.rollout_batch=192", override]))


def test_token_ratios_need_ppo_or_grpo():
    with pytest.raises(ConfigError, match="algo.ratio.*vtrace weighs whole samples"):
        derive(compose(["+experiment=toy", "algo.ratio=token", "algo=vtrace"]))
    derive(compose(["+experiment=toy", "algo.ratio=token", "algo=grpo"]))   # a token family with grpo: fine
    derive(compose(["+experiment=toy", "algo.ratio=token", "policy=pi05", "policy.patch=3"]))   # per action coordinate


def test_colocated_needs_equal_generator_and_trainer_ranks():
    with pytest.raises(ConfigError, match="cluster.train_ranks"):
        derive(compose(["mode.placement=colocated", "cluster.train_ranks=2"]))


def test_megatron_with_a_released_folder_is_refused_before_any_rank_starts(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text("{}")
    megatron = ["+experiment=toy", "policy=openvla", "policy.patch=3", "policy.lm=llama", "policy.lm_backend=megatron"]
    derive(compose(megatron))   # random init: the Megatron path
    with pytest.raises(ConfigError, match=r"policy.pretrained=.*lm_backend=megatron trains a random-initialised Llama only"):
        derive(compose([*megatron, f"policy.pretrained={tmp_path / 'llama'}"]))
    with pytest.raises(ConfigError, match=r"policy.data_parallel='fsdp'.*its own tensor parallelism"):
        derive(compose([*megatron, "policy.data_parallel=fsdp"]))


def test_fsdp_is_refused_for_a_family_without_a_torch_model():
    with pytest.raises(ConfigError, match=r"policy.data_parallel='fsdp'.*policy=emulated has no torch model"):
        derive(compose(["+experiment=emulated", "policy.data_parallel=fsdp"]))


def test_unknown_key_and_wrong_type_fail_at_compose():
    with pytest.raises(Exception, match="env.bogus"):
        compose(["env.bogus=1"])
    with pytest.raises(Exception, match="num_envs"):
        compose(["env.num_envs=abc"])


def test_sharding_strategies_build_valid_uneven_plans():
    cfg = compose(["+experiment=toy", "env.num_envs=7", "cluster.sim_ranks=2", "sharding.groups_per_rank=2",
                   "algo.rollout_batch=112", "algo.global_batch=56", "algo.micro_batch=56"])
    assert sharding_plan(cfg) == [[2, 2], [2, 1]]
    d = derive(cfg)
    assert [g.size for g in d.groups] == [2, 2, 2, 1] and d.size == 4
    cfg = compose(["+experiment=toy", "env.num_envs=8", "sharding.plan=[[3,1,4]]"])
    assert [g.size for g in derive(cfg).groups] == [3, 1, 4]


# The toy env and its policy only make sense together: the toy experiment selects both. GRPO needs
# whole episodes per segment and >= 2 envs per group, which depends on the env: its toy experiment
# (RAFT++ the whole episodes: the same experiment with algo=raft).
PAIRED = {"env=toy": "+experiment=toy", "policy=tiny_toy": "+experiment=toy", "algo=grpo": "+experiment=toy_grpo"}


@pytest.mark.parametrize("choice", [f"{p.parent.name}={p.stem}" for p in sorted(CONF_DIR.glob("*/*.yaml"))
                                    if p.parent.name not in ("experiment", "profile")])  # profile/: planner inputs, not run config
def test_every_config_file_composes_and_validates(choice, tmp_path):
    over = ["+experiment=toy_grpo", "algo=raft"] if choice == "algo=raft" else [PAIRED.get(choice, choice)]
    if choice == "policy=openvla_oft":   # it needs the user's released folder: a tiny one in the released layout
        from rlvla3.benchmarks.families import tiny_released_folder

        over.append(f"policy.pretrained={tiny_released_folder(compose(over), oft=True, folder=str(tmp_path / 'oft'))}")
    derive(compose(over))


@pytest.mark.parametrize("name", [p.stem for p in sorted((CONF_DIR / "experiment").glob("*.yaml"))])
def test_every_experiment_composes_and_validates(name, tmp_path):
    # An experiment is a recipe users run as-is (README): a batch size that no longer divides
    # its segments must fail here, not minutes into a run. openvla_oft has no random-init form:
    # its preset validates with a tiny released folder for the env's dims.
    from rlvla3.benchmarks.families import tiny_released_folder

    over = [f"+experiment={name}"]
    if compose(over).policy.name == "openvla_oft":
        over.append(f"policy.pretrained={tiny_released_folder(compose(over), oft=True, folder=str(tmp_path / 'oft'))}")
    derive(compose(over))


def test_defaults_are_the_robosuite_lift_run():
    cfg = compose([])
    assert (cfg.env.name, cfg.env.task, cfg.env.robot, cfg.mode.name, cfg.cluster.name) == (
        "robosuite", "Lift", "Panda", "async", "local")


def test_input_paths_are_checked_before_any_rank_starts(tmp_path):
    """A missing or wrong-kind checkpoint path fails in the launcher, naming the field (it used to
    be found after mpiexec had started every rank, inside an MPI abort traceback)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "+experiment=toy", f"run_dir={tmp_path / 'r'}",
                          f"policy.init_from={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"policy.init_from='{tmp_path}': no such file" in out.stderr and "is a folder" in out.stderr
    assert not (tmp_path / "r").exists() and "mpiexec" not in out.stdout


def test_a_run_folder_held_by_a_job_is_refused_before_anything_starts(tmp_path):
    """Two jobs on one run folder interleaved shards and overwrote checkpoints; now the job's
    rank 0 holds <run>/.lock and the launcher refuses the folder while it is held."""
    import subprocess
    import sys

    from rlvla3.engine.lock import RunFolderBusy, RunLock, check_free

    run = tmp_path / "run"
    held = RunLock(run).acquire()
    try:
        out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "+experiment=toy", f"run_dir={run}"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and "is in use by pid" in out.stderr, out.stderr[-2000:]
        assert not (run / "config.yaml").exists()
        with pytest.raises(RunFolderBusy, match=str(run)):
            RunLock(run).acquire()
    finally:
        held.release()
    check_free(run)                       # released: free again (a requeued job takes it back)


def test_a_folder_holding_a_previous_run_is_refused_unless_resumed(tmp_path):
    """A new run in a finished run's folder mixed its shards with the old ones and waited, until
    its timeout, for versions that never came; now it is refused before anything starts."""
    import subprocess
    import sys

    from rlvla3.cluster.compose import check_previous_run
    from rlvla3.config import ConfigError
    from rlvla3.engine import shards

    run = tmp_path / "run"
    (run / "shards" / shards.shard_name(0, 0, 0)).mkdir(parents=True)
    (run / "ckpt").mkdir()
    (run / "ckpt" / "v000001.pt").write_bytes(b"")
    out = subprocess.run([sys.executable, "-m", "rlvla3.launch", "+experiment=toy", f"run_dir={run}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "holds a previous run (1 shards, 1 checkpoints)" in out.stderr, out.stderr[-2000:]
    assert "resume=true" in out.stderr and not (run / "config.yaml").exists()
    with pytest.raises(ConfigError, match="previous run"):
        check_previous_run(compose(["+experiment=toy"]), run)
    check_previous_run(compose(["+experiment=toy", "resume=true"]), run)   # continuing it is what resume is for
    check_previous_run(compose(["+experiment=toy"]), tmp_path / "new")


def test_the_console_first_says_what_the_run_will_do(tmp_path):
    from rlvla3.cluster.launch import describe

    cfg = compose(["+experiment=libero_pi05", "mode=sync", "cluster.sim_ranks=2"])
    text = describe(cfg, derive(cfg), tmp_path)
    assert text.splitlines()[0].startswith("rlvla3: ppo on libero libero_spatial tasks [0] (2 envs, horizon 220), "
                                           "policy pi05 (chunk 50, random init), sync")
    assert "2 Simulator, 1 Generator, 1 Trainer" in text and str(tmp_path) in text and "4 versions" in text
    folder = tmp_path / "pi05"
    cfg = compose(["+experiment=toy", f"policy.pretrained={folder}"])   # describe reads no folder
    assert "from " + str(folder) + ", LoRA rank 32" in describe(cfg, derive(compose(["+experiment=toy"])), tmp_path)
