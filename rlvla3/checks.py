"""Every check of a run's config before any rank starts: first each section's own fields (the
`check()` beside them in config.py), then the checks that read across fields, sections, the envs'
and families' registries and the disk, one function per section. The first bad value raises
ConfigError naming the field, its value and how to fix it (`validate`, through `world.derive`).
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from .algo import ALGORITHMS
from .config import ConfigError, RunConfig, require
from .envs import SIM_MODULES, env_dims, interpreter
from .envs.images import CROP_AREA, PIPELINES, render_size
from .policies import execute_steps
from .policies.openvla.layout import is_released_openvla as released_openvla
from .policies.pi.layout import hashed_pi05_min_length
from .policies.prompts import instruction_encoder
from .policies.registry import FAMILIES

SECTIONS = ("env", "policy", "algo", "mode", "generator", "cluster", "runtime")


def validate(cfg: RunConfig, sharding_plan) -> None:
    """Check every field a run depends on; the first bad one raises ConfigError. sharding_plan:
    the world's derivation of the plan (cfg -> group sizes per Simulator rank), checked last."""
    for name in SECTIONS:
        getattr(cfg, name).check()
    env(cfg)
    policy(cfg)
    algo(cfg)
    generator(cfg)
    runtime(cfg)
    evaluation(cfg)
    if cfg.cluster.name != "local":
        slurm(cfg)
    cluster(cfg, sharding_plan(cfg))


def refuse(broken) -> None:
    """An algorithm's rule that found a bad value (field, value, fix): raise it."""
    if broken is not None:
        require(False, *broken)


def require_path(path: str, name: str, what: str, want_dir: bool) -> None:
    """An input path the run will read: checked before any rank starts (empty: not used)."""
    if not path:
        return
    p = Path(path)
    ok = p.is_dir() if want_dir else p.is_file()
    require(ok, name, path, f"no such {'folder' if want_dir else 'file'}; give {what}" +
            (f" ({p} is a {'folder' if p.is_dir() else 'file'})" if p.exists() else ""))


# ---------------------------------------------------------------- env


def env(cfg: RunConfig) -> None:
    e = cfg.env
    require(e.name in SIM_MODULES, "env.name", e.name, f"use one of {', '.join(SIM_MODULES)}")
    require(e.arm_controller == "OSC_POSE" or e.name in ("robosuite", "libero"), "env.arm_controller", e.arm_controller,
            f"only env.name=robosuite or libero can change its arm controller (env.name={e.name!r})")
    require(e.image_pipeline in PIPELINES, "env.image_pipeline", e.image_pipeline, f"use one of {', '.join(PIPELINES)}")
    require(e.image_pipeline == "direct" or e.name == "libero", "env.image_pipeline", e.image_pipeline,
            f"the released evaluations' image pipelines are LIBERO's; env.name={e.name!r} renders direct")
    if e.name == "libero":
        libero(e)
    require(e.task_sampling == "uniform" or (e.name == "libero" and len(e.task_ids) >= 2), "env.task_sampling",
            e.task_sampling, "task_sampling=failure chooses among several tasks: give env=libero and at least two env.task_ids")
    require(e.task_sampling == "uniform" or (ALGORITHMS[cfg.algo.name].shared_reset and not cfg.runtime.evaluate),
            "env.task_sampling", e.task_sampling, f"the Simulator picks the task of a group's shared reset (algo=grpo); "
            f"algo={cfg.algo.name} resets each env from its own seed: use task_sampling=uniform")
    require_path(interpreter(cfg), "env.python", "an interpreter of the env's virtual environment (<venv>/bin/python)",
                 want_dir=False)
    require(not e.python or os.access(interpreter(cfg), os.X_OK), "env.python", e.python, "is not executable")


def libero(e) -> None:
    from .envs.libero_env import CAMERAS, PERTURBATIONS, PERTURBED, STANDARD_SUITES, SUITES

    require(e.suite in SUITES, "env.suite", e.suite,
            f"use one of {', '.join(STANDARD_SUITES)}, or a LIBERO-PRO perturbation <suite>_<{'|'.join(PERTURBATIONS)}> "
            f"of {', '.join(PERTURBED)}")
    require(len(e.task_ids) >= 1, "env.task_ids", list(e.task_ids), "name at least one task of the suite")
    bad = [t for t in e.task_ids if not 0 <= t < SUITES[e.suite]]
    require(not bad, "env.task_ids", list(e.task_ids), f"{e.suite} has tasks 0..{SUITES[e.suite] - 1} (out of range: {bad})")
    require(set(e.cameras) <= set(CAMERAS), "env.cameras", list(e.cameras), f"LIBERO's cameras are {', '.join(CAMERAS)}")
    rendered = render_size(e.image_pipeline, e.image_size)
    require(e.image_size <= rendered, "env.image_size", e.image_size,
            f"env.image_pipeline={e.image_pipeline} renders at {rendered} and shrinks to env.image_size: use at most {rendered}")
    require(bool(e.python), "env.python", e.python, "LIBERO runs under its own interpreter: bash scripts/setup_libero.sh "
            "makes .venv-libero (conf/env/libero.yaml points env.python at it)")


# ---------------------------------------------------------------- policy


def policy(cfg: RunConfig) -> None:
    p, e = cfg.policy, cfg.env
    require(p.name in FAMILIES, "policy.name", p.name, f"use one of {', '.join(FAMILIES)}")
    require(p.name != "openvla_oft" or bool(p.pretrained), "policy.pretrained", p.pretrained,
            "policy=openvla_oft loads a released OpenVLA-OFT folder (its L1 action head has no random-init form); "
            "for OFT-style decoding from scratch use policy=openvla policy.decoding=parallel")
    if not released_openvla(p):   # a released checkpoint resizes the frames to its own towers' input
        require(e.image_size >= p.patch, "env.image_size", e.image_size, f"must be >= policy.patch={p.patch}")
        require(e.image_size % p.patch == 0, "env.image_size", e.image_size, f"must be a multiple of policy.patch={p.patch}")
    require(p.flow_rl == "fixed" or FAMILIES[p.name].samples == "chain", "policy.flow_rl", p.flow_rl,
            f"policy={p.name} does not sample a denoising chain: flow_rl applies to "
            f"{', '.join(n for n, f in FAMILIES.items() if f.samples == 'chain')}; drop the override")
    require(p.data_parallel == "replicate" or FAMILIES[p.name].torch, "policy.data_parallel", p.data_parallel,
            f"policy={p.name} has no torch model to shard: use data_parallel=replicate")
    if p.lm_backend == "megatron":
        megatron(cfg)
    require(e.image_pipeline != "openvla" or p.image_crop == 1.0, "policy.image_crop", p.image_crop,
            f"env.image_pipeline=openvla already crops the centre {CROP_AREA} of the area as OpenVLA's evaluation does: "
            "leave policy.image_crop=1.0")
    require(p.discrete_state_input or p.name == "pi05", "policy.discrete_state_input", p.discrete_state_input,
            f"only pi05 writes its state into the prompt; policy={p.name} reads the proprio as a token: drop the override")
    if p.name == "pi05" and not p.pretrained and p.discrete_state_input:   # the prompt carries the state: the env's proprio must fit
        proprio_dim = env_dims(cfg).proprio_dim
        need = hashed_pi05_min_length(proprio_dim)
        require(p.instruction_len >= need, "policy.instruction_len", p.instruction_len,
                f"a random-initialised pi05's prompt holds the task, the {proprio_dim} state values as "
                f"digits (up to 4 words each) and 4 fixed words: give at least {need} (more for a longer instruction)")
    require_path(p.init_from, "policy.init_from", "a checkpoint: a file (.pt), or a sharded run's folder (.dcp)",
                 want_dir=p.init_from.endswith(".dcp"))   # FSDP's checkpoints are folders of shards
    require_path(p.pretrained, "policy.pretrained", "a local checkpoint folder (config.json + weights)", want_dir=True)
    if p.pretrained:
        pretrained(cfg)


def megatron(cfg: RunConfig) -> None:
    p, c = cfg.policy, cfg.cluster
    require(p.name == "openvla" and p.lm == "llama", "policy.lm_backend", p.lm_backend,
            "the megatron backend trains the Llama LM of policy=openvla: set policy.lm=llama")
    require(p.data_parallel == "replicate", "policy.data_parallel", p.data_parallel,
            "lm_backend=megatron splits the model with its own tensor parallelism: use data_parallel=replicate")
    require(c.train_ranks % p.tensor_parallel == 0, "policy.tensor_parallel", p.tensor_parallel,
            f"must divide cluster.train_ranks={c.train_ranks}")
    require(p.heads % p.tensor_parallel == 0 and 128 % p.tensor_parallel == 0, "policy.tensor_parallel",
            p.tensor_parallel, f"must divide policy.heads={p.heads} and 128 (the LM vocabulary is padded to a multiple of 128)")
    require(cfg.mode.placement == "disaggregated", "mode.placement", cfg.mode.placement,
            "lm_backend=megatron needs disaggregated placement (Generators run transformers)")
    # Refused here rather than after the ranks start: the Megatron path converts a random-init
    # transformers Llama to Megatron's TP layout and trains it with torch's Adam; reading a released
    # folder into that layout, LoRA over it (its base_layer names) and Megatron's DDP and
    # distributed optimizer are not built.
    require(not p.pretrained, "policy.pretrained", p.pretrained,
            "lm_backend=megatron trains a random-initialised Llama only (loading a released folder into Megatron's "
            "tensor-parallel layout, LoRA over it and Megatron's distributed optimizer are not built): use "
            "policy.lm_backend=transformers with policy.pretrained")


LEROBOT_FOLDERS = ("pi0", "pi05", "smolvla")   # families loading a LeRobot folder: config.json's type, processor files


def pretrained(cfg: RunConfig) -> None:
    """A pretrained checkpoint this run can use, with the tokenizer it reads its prompt with."""
    from .policies.gr00t import layout as gr00t_layout
    from .policies.openvla import layout as openvla_folder
    from .policies.pi import layout as pi_layout
    from .policies.smolvla import layout as smolvla_layout

    p = cfg.policy
    if released_openvla(p):
        require(p.lm_backend == "transformers", "policy.lm_backend", p.lm_backend,
                "a released OpenVLA folder trains with lm_backend=transformers")
    try:
        if released_openvla(p):
            openvla_folder.check(p, env_dims(cfg).action_dim, env_dims(cfg).proprio_dim)
        elif p.name == "gr00t":
            gr00t_layout.check_folder(p.pretrained, env_dims(cfg).proprio_dim, env_dims(cfg).action_dim)
            instruction_encoder(p)   # Eagle's tokenizer loads
        elif p.name in LEROBOT_FOLDERS:
            pi_layout.check_folder_type(p.pretrained, p.name)
            if p.name == "smolvla":
                smolvla_layout.check_folder(p.pretrained)
            said = pi_layout.execute_steps(p.pretrained)
            require(p.execute_steps or not said or said <= p.chunk, "policy.execute_steps", p.execute_steps,
                    f"the folder's config.json says n_action_steps={said}, more than policy.chunk={p.chunk}: "
                    "set policy.chunk to its chunk_size, or policy.execute_steps")
            instruction_encoder(p)   # its tokenizer (and π0.5's state statistics) load
            # the statistics the flow reads: the state's (π0's and SmolVLA's state token; π0.5's
            # prompt reads it through its encoder) and the actions'
            pi_layout.folder_normaliser(p.pretrained, env_dims(cfg), state=p.name != "pi05")
    except (OSError, ValueError, KeyError) as e:
        why = e.args[0] if isinstance(e, KeyError) else e
        raise ConfigError(f"policy={p.name} policy.pretrained={p.pretrained}: {why}") from None


# ---------------------------------------------------------------- algo


def algo(cfg: RunConfig) -> None:
    """The algorithm's own rules (algo.ALGORITHMS), then the batch arithmetic every algorithm shares."""
    a, e = cfg.algo, cfg.env
    require(a.name in ALGORITHMS, "algo.name", a.name, f"use one of {', '.join(ALGORITHMS)}")
    if cfg.runtime.evaluate or ALGORITHMS[a.name].episodic:   # an evaluation, or outcome advantages
        executed = execute_steps(cfg.policy)   # a released folder may say it: read here, not in algo.py
        user = "evaluation" if cfg.runtime.evaluate else a.name
        require(a.segment_steps * executed >= e.horizon, "algo.segment_steps", a.segment_steps,
                f"{user} uses whole episodes: a segment must hold one (algo.segment_steps * {executed} actions "
                f"executed a chunk >= env.horizon={e.horizon})")
    for rule in ALGORITHMS[a.name].rules:
        refuse(rule(cfg))
    seg = e.num_envs * a.segment_steps
    require(a.rollout_batch >= seg and a.rollout_batch % seg == 0, "algo.rollout_batch", a.rollout_batch,
            f"must be a positive multiple of env.num_envs * algo.segment_steps = {seg}")
    require(a.global_batch >= 1 and a.rollout_batch % a.global_batch == 0, "algo.global_batch", a.global_batch,
            f"must divide algo.rollout_batch={a.rollout_batch}")
    require(1 <= a.micro_batch <= a.global_batch, "algo.micro_batch", a.micro_batch,
            f"must be in 1..algo.global_batch={a.global_batch}")


# ---------------------------------------------------------------- cluster, generator, sharding


def cluster(cfg: RunConfig, plan: list[list[int]]) -> None:
    c = cfg.cluster
    if cfg.mode.placement == "colocated":
        require(c.train_ranks == c.gen_ranks, "cluster.train_ranks", c.train_ranks,
                f"colocated placement puts one Trainer on each Generator rank: set it to cluster.gen_ranks={c.gen_ranks}")
    sharding(cfg, plan)


def generator(cfg: RunConfig) -> None:
    g, p = cfg.generator, cfg.policy
    require(0 <= g.adapt_batch <= min(g.b_max, p.max_batch), "generator.adapt_batch", g.adapt_batch,
            "use 0 (off) or a target batch <= min(generator.b_max, policy.max_batch)")


def sharding(cfg: RunConfig, plan: list[list[int]]) -> None:
    e, c, s = cfg.env, cfg.cluster, cfg.sharding
    require(len(plan) == c.sim_ranks, "sharding.plan", s.plan, f"needs one list per Simulator rank (cluster.sim_ranks={c.sim_ranks})")
    require(all(len(r) >= 1 and all(k >= 1 for k in r) for r in plan), "sharding.plan", plan,
            f"every Simulator rank needs >= 1 group of >= 1 env; env.num_envs={e.num_envs} may be < cluster.sim_ranks={c.sim_ranks}")
    require(sum(map(sum, plan)) == e.num_envs, "sharding.plan", plan, f"group sizes must add up to env.num_envs={e.num_envs}")
    b_max = min(cfg.generator.b_max, cfg.policy.max_batch)
    for rule in ALGORITHMS[cfg.algo.name].group_rules:
        refuse(rule(plan))
    require(max(map(max, plan)) <= b_max, "sharding.plan", plan,
            f"a group larger than the batch limit min(generator.b_max, policy.max_batch)={b_max} could never be served")
    require(len(plan) and sum(len(r) for r in plan) >= c.gen_ranks, "cluster.gen_ranks", c.gen_ranks,
            "more Generators than env groups would leave a Generator idle")
    require(sum(len(r) for r in plan) < 30000, "sharding.plan", "too many groups", "keep under 30000 groups (MPI tag range)")


# ---------------------------------------------------------------- runtime, evaluation


def runtime(cfg: RunConfig) -> None:
    rt = cfg.runtime
    require(not rt.wandb or importlib.util.find_spec("wandb") is not None, "runtime.wandb", rt.wandb,
            "needs the wandb package: pip install -e '.[wandb]' (or runtime.wandb=false)")


def evaluation(cfg: RunConfig) -> None:
    """runtime.eval_every and its settings (evaluation while training), generator.greedy."""
    rt = cfg.runtime
    require(not cfg.generator.greedy or rt.evaluate, "generator.greedy", cfg.generator.greedy,
            "evaluation only (python -m rlvla3.evaluate --greedy): RL learns from sampled actions and their log-probs")
    if not rt.eval_every:
        return
    require(cfg.policy.name != "emulated", "runtime.eval_every", rt.eval_every,
            "needs a policy with weights to evaluate (policy=emulated has none); set runtime.eval_every=0")
    require(not rt.evaluate, "runtime.eval_every", rt.eval_every, "an evaluation run does not evaluate itself again")


# ---------------------------------------------------------------- Slurm


SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # what may reach an #SBATCH line unquoted
SLURM_TIME = re.compile(r"\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?")


def gpu_ranks(cfg: RunConfig) -> int:
    """Ranks of the GPU component: one GPU each (colocated: Generator and Trainer share it)."""
    c = cfg.cluster
    return c.gen_ranks + (0 if cfg.mode.placement == "colocated" else c.train_ranks)


def slurm(cfg: RunConfig) -> None:
    """Site settings of a Slurm cluster, checked before anything is submitted."""
    c = cfg.cluster
    require(SLURM_NAME.fullmatch(c.name) is not None, "cluster.name", c.name, "use letters, digits, _ . + -")
    for name in ("cpu_partition", "gpu_partition"):
        v = getattr(c, name)
        require(SLURM_NAME.fullmatch(v) is not None, f"cluster.{name}", v,
                "set the Slurm partition name (letters, digits, _ . + -), e.g. in conf/site/local.yaml")
    for name in ("account", "qos"):
        v = getattr(c, name)
        require(v == "" or SLURM_NAME.fullmatch(v) is not None, f"cluster.{name}", v,
                "use letters, digits, _ . + - (or empty for the default)")
    require(SLURM_TIME.fullmatch(c.time) is not None, "cluster.time", c.time,
            "use Slurm's format: MM, HH:MM:SS or D-HH:MM:SS")
    require(SLURM_NAME.fullmatch(c.mpi) is not None, "cluster.mpi", c.mpi, "name an srun --mpi plugin, e.g. pmix")
    require(c.gpus_per_node >= 1, "cluster.gpus_per_node", c.gpus_per_node, "must be >= 1")
    g = gpu_ranks(cfg)
    require(g <= c.gpus_per_node or g % c.gpus_per_node == 0, "cluster.gen_ranks", c.gen_ranks,
            f"Generator + Trainer GPUs ({g}) must fill whole nodes of cluster.gpus_per_node={c.gpus_per_node} "
            "(or fit in one)")
    per_node = min(g, c.gpus_per_node)
    require(1 <= c.cpus_per_gpu_rank and per_node * c.cpus_per_gpu_rank <= c.cores_per_gpu_node,
            "cluster.cpus_per_gpu_rank", c.cpus_per_gpu_rank,
            f"{per_node} GPU ranks per node x this must fit cluster.cores_per_gpu_node={c.cores_per_gpu_node}")
    require(1 <= c.cpus_per_sim_rank <= c.cores_per_cpu_node, "cluster.cpus_per_sim_rank", c.cpus_per_sim_rank,
            f"must be in 1..cluster.cores_per_cpu_node={c.cores_per_cpu_node}")
    require(c.signal_delay_s >= 10, "cluster.signal_delay_s", c.signal_delay_s,
            "leave the Trainer >= 10 s to checkpoint before the time limit")
    require(c.max_requeues >= 0, "cluster.max_requeues", c.max_requeues, "must be >= 0")
    require(c.poll_s > 0, "cluster.poll_s", c.poll_s, "must be > 0")
    for line in c.setup:
        require("\n" not in line, "cluster.setup", line, "one shell line per list entry")
