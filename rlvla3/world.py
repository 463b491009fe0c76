"""What a run derives from its config, and the checks that run before any rank starts.

`derive(cfg)` validates a `config.RunConfig` (raising `ConfigError` that names the bad field and
how to fix it) and returns the `World`: which rank plays which role, the env groups of the
sharding plan and the Generator serving each, and the rollout-step arithmetic. `spec(cfg)` is the
observation/sample spec every role agrees on (from the env adapter's dimensions and the policy
family's sample layout). Nothing here imports a simulator, torch or mpi4py: the launcher runs it
on a login node.
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .config import OBS_COMPRESSIONS, SHARD_CODECS, WAKES, ConfigError, RunConfig
from .envs import env_dims, in_process, interpreter
from .policies import SampleLayout, sample_layout
from .policies.prompts import hashed_pi05_min_length, instruction_encoder
from .policies.prompts import is_released_openvla as released_openvla
from .policies.registry import FAMILIES

ROLES = ("simulator", "generator", "trainer")


@dataclass(frozen=True)
class Group:
    """One env group: `size` envs on Simulator rank `sim_rank`, served by Generator `gen_index`."""

    gid: int
    sim_rank: int
    size: int
    env_offset: int
    gen_index: int


@dataclass(frozen=True)
class Spec:
    """Shapes of one observation, action chunk and policy sample: what every role agrees on (the
    Simulator's buffers, the wire codecs, the shard arrays, the policy's input)."""

    cameras: int
    image_size: int
    proprio_dim: int
    action_dim: int
    instruction_len: int
    vocab: int
    sample: SampleLayout     # what the policy samples per observation

    @property
    def chunk(self) -> int:
        return self.sample.chunk


def spec(cfg: RunConfig) -> Spec:
    """The Spec of a run: the env adapter's sizes and the policy family's sample layout."""
    e, p = cfg.env, cfg.policy
    dims = env_dims(cfg)
    return Spec(dims.cameras, e.image_size, dims.proprio_dim, dims.action_dim, p.instruction_len, p.vocab,
                sample_layout(p, dims.action_dim))


@dataclass(frozen=True)
class World:
    """What a run derives from its config, computed once by `derive`: the MPI world (which rank
    plays which role), the env groups, and the rollout-step arithmetic. Role code reads these
    fields; it never recomputes them from the config."""

    size: int
    """Ranks in the MPI world (colocated placement: Generator and Trainer share a rank)."""
    sim_ranks: tuple[int, ...]
    gen_ranks: tuple[int, ...]
    train_ranks: tuple[int, ...]
    groups: tuple[Group, ...]
    segments_per_step: int
    """Segments each group contributes to one rollout step."""
    opt_steps_per_epoch: int
    """Optimizer steps in one pass over a rollout step (rollout_batch / global_batch)."""
    opt_steps_per_version: int
    """Optimizer steps per version (update_epochs passes)."""
    b_max: int
    """The batcher's sample limit: generator.b_max capped at policy.max_batch."""
    episodic: bool
    """Whole episodes per segment (grpo, raft, evaluation): every env of a group resets at each segment
    start, and an env whose episode ended waits for that reset."""
    shared_reset: bool
    """grpo training: a group's envs reset from one seed (`group_seed`), so a GRPO group is one
    initial state. Never in evaluation: there each env resets from its own seeds, so N episodes
    are N distinct initial states, as the Wilson interval assumes."""
    in_process_envs: bool
    """Envs run inside the Simulator rank (toy, emulated, env.in_process), not one child each."""
    colocated: bool
    """mode.placement=colocated: each Generator rank also hosts a Trainer."""
    lockstep: bool
    """mode.env_level off: all groups of a lockstep component advance together (sync baseline)."""
    weights_tree: tuple[tuple[int | None, tuple[int, ...]], ...] = ()
    """The publish's relay tree (relay_tree) as ranks: (parent rank, child ranks)
    of Trainer 0 (first, parent None) and then of each Generator in gen_ranks' order."""

    def publish_children(self) -> tuple[int, ...]:
        """The Generators Trainer 0 sends a publish (and Stop) to itself."""
        return self.weights_tree[0][1]

    def relay_parent(self, gen_rank: int) -> int:
        """Where Generator `gen_rank` receives a publish (and Stop) from: Trainer 0 or a Generator."""
        return self.weights_tree[1 + self.gen_ranks.index(gen_rank)][0]

    def relay_children(self, gen_rank: int) -> tuple[int, ...]:
        """The Generators Generator `gen_rank` forwards a publish (and Stop) to."""
        return self.weights_tree[1 + self.gen_ranks.index(gen_rank)][1]

    def roles_of(self, rank: int) -> list[str]:
        """The roles `rank` plays (two when colocated: generator and trainer)."""
        return [r for r, ranks in zip(ROLES, (self.sim_ranks, self.gen_ranks, self.train_ranks)) if rank in ranks]

    def role_name(self, rank: int) -> str:
        return "+".join(self.roles_of(rank))

    def groups_of_sim(self, rank: int) -> list[Group]:
        return [g for g in self.groups if g.sim_rank == rank]

    def groups_of_gen(self, gen_index: int) -> list[Group]:
        return [g for g in self.groups if g.gen_index == gen_index]

    def gen_rank_of(self, g: Group) -> int:
        return self.gen_ranks[g.gen_index]


def sharding_plan(cfg: RunConfig) -> list[list[int]]:
    """Group sizes per Simulator rank, from the named strategy or the explicit plan."""
    s, n, ranks = cfg.sharding, cfg.env.num_envs, cfg.cluster.sim_ranks
    if s.plan:
        return [list(r) for r in s.plan]
    per_rank = [n // ranks + (1 if r < n % ranks else 0) for r in range(ranks)]
    if s.strategy == "per_env":
        return [[1] * k for k in per_rank]
    if s.strategy == "aggregated":
        return [[k] for k in per_rank]
    if s.strategy == "pipelined":
        plan = []
        for k in per_rank:
            g = min(s.groups_per_rank, k)
            plan.append([k // g + (1 if i < k % g else 0) for i in range(g)])
        return plan
    raise ConfigError(f"sharding.strategy={s.strategy!r} is unknown; use per_env, pipelined or aggregated")


def assign_generators(sizes: list[int], n_gen: int) -> list[int]:
    """Greedy: each group (largest first) goes to the Generator serving the fewest envs so far."""
    load = [0] * n_gen
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        j = min(range(n_gen), key=lambda j: (load[j], j))
        owner[i] = j
        load[j] += sizes[i]
    return owner


OUTCOME_ALGOS = ("grpo", "raft")
"""Algorithms that learn from whole episodes' outcomes (success 1/0) with no critic."""


def episodic(cfg: RunConfig) -> bool:
    """Whole episodes per segment (grpo, raft, evaluation): every env of a group resets at each segment
    start (`shared_reset`: all from one seed), and an env whose episode ended waits for that reset."""
    return cfg.algo.name in OUTCOME_ALGOS or cfg.runtime.evaluate


def shared_reset(cfg: RunConfig) -> bool:
    """grpo training: a group's envs reset from one seed (`group_seed`), so a GRPO group is one
    initial state. Never in evaluation: there each env resets from its own seeds, so N episodes
    are N distinct initial states, as the Wilson interval assumes."""
    return cfg.algo.name == "grpo" and not cfg.runtime.evaluate


def group_seed(cfg: RunConfig, gid: int, seq: int) -> int:
    """The shared reset seed of group `gid`'s segment `seq` (episodic mode)."""
    return (cfg.seed * 1_000_003 + gid * 100_003 + seq * 7 + 1) % (2**31 - 1)


def relay_tree(n_generators: int, fanout: int) -> list[tuple[int | None, list[int]]]:
    """(parent, children) of every node of a weights publish: node 0 is Trainer 0, node i >= 1 the
    i-th Generator. fanout >= 1: a complete fanout-ary tree in Generator order (node i's children
    are i*fanout+1 .. i*fanout+fanout); fanout 0: every Generator a child of Trainer 0."""
    n = n_generators + 1
    if fanout == 0:
        return [(None, list(range(1, n)))] + [(0, []) for _ in range(1, n)]
    return [((i - 1) // fanout if i else None, [c for c in range(i * fanout + 1, i * fanout + fanout + 1) if c < n])
            for i in range(n)]


def derive(cfg: RunConfig) -> World:
    """Validate `cfg` and compute the layout. Raises ConfigError naming the bad field."""
    validate(cfg)
    c = cfg.cluster
    colocated = cfg.mode.placement == "colocated"
    sims = tuple(range(c.sim_ranks))
    gens = tuple(range(c.sim_ranks, c.sim_ranks + c.gen_ranks))
    trains = gens if colocated else tuple(range(gens[-1] + 1, gens[-1] + 1 + c.train_ranks))
    plan = sharding_plan(cfg)
    flat = [(r, size) for r, sizes in enumerate(plan) for size in sizes]
    owners = assign_generators([s for _, s in flat], c.gen_ranks)
    groups, offset = [], 0
    for gid, ((r, size), gen) in enumerate(zip(flat, owners)):
        groups.append(Group(gid, sims[r], size, offset, gen))
        offset += size
    a = cfg.algo
    per_epoch = a.rollout_batch // a.global_batch
    node_rank = (trains[0], *gens)   # relay_tree's nodes: Trainer 0, then the Generators
    tree = tuple((None if p is None else node_rank[p], tuple(node_rank[c] for c in kids))
                 for p, kids in relay_tree(len(gens), cfg.generator.weights_fanout))
    return World(
        size=len(sims) + len(gens) + (0 if colocated else len(trains)),
        sim_ranks=sims,
        gen_ranks=gens,
        train_ranks=trains,
        groups=tuple(groups),
        segments_per_step=a.rollout_batch // (cfg.env.num_envs * a.segment_steps),
        opt_steps_per_epoch=per_epoch,
        opt_steps_per_version=a.update_epochs * per_epoch,
        b_max=min(cfg.generator.b_max, cfg.policy.max_batch),
        episodic=episodic(cfg),
        shared_reset=shared_reset(cfg),
        in_process_envs=in_process(cfg),
        colocated=colocated,
        lockstep=not cfg.mode.env_level,
        weights_tree=tree,
    )


def _require(ok: bool, name: str, value, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {fix}")


def _require_path(path: str, name: str, what: str, want_dir: bool) -> None:
    """An input path the run will read: checked before any rank starts (empty: not used)."""
    if not path:
        return
    p = Path(path)
    ok = p.is_dir() if want_dir else p.is_file()
    _require(ok, name, path, f"no such {'folder' if want_dir else 'file'}; give {what}" +
             (f" ({p} is a {'folder' if p.is_dir() else 'file'})" if p.exists() else ""))


def _validate_pretrained(cfg: RunConfig) -> None:
    """A pretrained checkpoint this run can use, with the tokenizer it reads its prompt with."""
    from .policies import openvla_folder

    p = cfg.policy
    if released_openvla(p):
        _require(p.lm_backend == "transformers", "policy.lm_backend", p.lm_backend,
                 "a released OpenVLA folder trains with lm_backend=transformers")
    if p.lora_rank:
        _require(p.lora_alpha > 0, "policy.lora_alpha", p.lora_alpha, "must be > 0")
        _require(p.lora_base_dtype in ("float32", "bfloat16"), "policy.lora_base_dtype", p.lora_base_dtype,
                 "use bfloat16 or float32")
    try:
        if released_openvla(p):
            openvla_folder.check(p, env_dims(cfg).action_dim, env_dims(cfg).proprio_dim)
        elif p.name in ("pi0", "pi05"):
            instruction_encoder(p)   # its tokenizer (and π0.5's state statistics) load
    except (OSError, ValueError, KeyError) as e:
        why = e.args[0] if isinstance(e, KeyError) else e
        raise ConfigError(f"policy={p.name} policy.pretrained={p.pretrained}: {why}") from None


def _validate_libero(e) -> None:
    from .envs.libero_env import CAMERAS, SUITES

    _require(e.suite in SUITES, "env.suite", e.suite, f"use one of {', '.join(SUITES)}")
    _require(len(e.task_ids) >= 1, "env.task_ids", list(e.task_ids), "name at least one task of the suite")
    bad = [t for t in e.task_ids if not 0 <= t < SUITES[e.suite]]
    _require(not bad, "env.task_ids", list(e.task_ids), f"{e.suite} has tasks 0..{SUITES[e.suite] - 1} (out of range: {bad})")
    _require(set(e.cameras) <= set(CAMERAS), "env.cameras", list(e.cameras), f"LIBERO's cameras are {', '.join(CAMERAS)}")
    _require(e.init_states in ("sampled", "fixed"), "env.init_states", e.init_states, "use sampled or fixed")
    _require(e.settle_steps >= 0, "env.settle_steps", e.settle_steps, "must be >= 0")
    _require(bool(e.python), "env.python", e.python, "LIBERO runs under its own interpreter: bash scripts/setup_libero.sh "
             "makes .venv-libero (conf/env/libero.yaml points env.python at it)")


def run_records(cfg: RunConfig) -> dict[str, dict]:
    """Files the launcher writes into a run folder beside the config, by env: LIBERO's
    init_states.json (which initial states the run trains or evaluates on)."""
    if cfg.env.name == "libero":
        from .envs.libero_env import state_split

        return {"init_states.json": state_split(cfg)}
    return {}


def success_hint(cfg: RunConfig) -> list[str]:
    """What a good success value is, where the env has a measured one (toy: chance and learned)."""
    if cfg.env.name != "toy" or cfg.runtime.evaluate:
        return []
    from .envs.toy import SUCCESS_HINT

    return [SUCCESS_HINT]


def check_env(cfg: RunConfig) -> None:
    """The env's interpreter hosts it and its simulator accepts the named task, suite, robot and
    cameras (the launcher's check: it starts that interpreter, so it is not part of `validate`,
    which every rank runs)."""
    from .envs.hosting import check_env as check_in_interpreter

    try:
        check_in_interpreter(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _validate_env(e) -> None:
    """The env fields every run depends on."""
    _require(e.name in ("toy", "emulated", "robosuite", "metaworld", "libero", "robocasa", "maniskill"), "env.name", e.name,
             "use toy, emulated, robosuite, metaworld, libero, robocasa or maniskill")
    if e.name == "libero":
        _validate_libero(e)
    _require(e.num_envs >= 1, "env.num_envs", e.num_envs, "must be >= 1")
    _require(e.seed_order in ("hashed", "sequential"), "env.seed_order", e.seed_order, "use hashed or sequential")
    _require(e.arm_controller in ("OSC_POSE", "OSC_POSITION"), "env.arm_controller", e.arm_controller,
             "use OSC_POSE or OSC_POSITION")
    _require(e.arm_controller == "OSC_POSE" or e.name in ("robosuite", "libero"), "env.arm_controller", e.arm_controller,
             f"only env.name=robosuite or libero can change its arm controller (env.name={e.name!r})")
    _require(e.horizon >= 1, "env.horizon", e.horizon, "must be >= 1")
    _require(e.max_failed_starts >= 0, "env.max_failed_starts", e.max_failed_starts, "must be >= 0")
    _require(len(e.cameras) >= 1, "env.cameras", e.cameras, "name at least one camera")
    for name in ("step_timeout", "reset_timeout", "start_timeout"):
        _require(getattr(e, name) > 0, f"env.{name}", getattr(e, name), "timeouts must be > 0")
    _require(0.0 <= e.success_rate <= 1.0, "env.success_rate", e.success_rate, "must be in [0, 1]")


def validate(cfg: RunConfig) -> None:
    """Check every field a run depends on; the first bad one raises ConfigError."""
    e, p, a, m, c, s = cfg.env, cfg.policy, cfg.algo, cfg.mode, cfg.cluster, cfg.sharding
    _validate_env(e)
    _require(p.name in FAMILIES, "policy.name", p.name, f"use one of {', '.join(FAMILIES)}")
    _require(p.name != "openvla_oft" or bool(p.pretrained), "policy.pretrained", p.pretrained,
             "policy=openvla_oft loads a released OpenVLA-OFT folder (its L1 action head has no random-init form); "
             "for OFT-style decoding from scratch use policy=openvla policy.decoding=parallel")
    if not released_openvla(p):   # a released checkpoint resizes the frames to its own towers' input
        _require(p.patch >= 1, "policy.patch", p.patch, "must be >= 1 (pixels per image patch)")
        _require(e.image_size >= p.patch, "env.image_size", e.image_size, f"must be >= policy.patch={p.patch}")
        _require(e.image_size % p.patch == 0, "env.image_size", e.image_size, f"must be a multiple of policy.patch={p.patch}")
    _require(p.chunk >= 1, "policy.chunk", p.chunk, "must be >= 1 (actions per forward)")
    _require(p.decoding in ("parallel", "autoregressive"), "policy.decoding", p.decoding, "use parallel or autoregressive")
    _require(p.lm in ("qwen2", "llama"), "policy.lm", p.lm, "use qwen2 or llama")
    _require(p.denoise_steps >= 1, "policy.denoise_steps", p.denoise_steps, "must be >= 1")
    _require(p.lm_backend in ("transformers", "megatron"), "policy.lm_backend", p.lm_backend, "use transformers or megatron")
    _require(p.tensor_parallel >= 1, "policy.tensor_parallel", p.tensor_parallel, "must be >= 1")
    if p.lm_backend == "megatron":
        _require(p.name == "openvla" and p.lm == "llama", "policy.lm_backend", p.lm_backend,
                 "the megatron backend trains the Llama LM of policy=openvla: set policy.lm=llama")
        _require(c.train_ranks % p.tensor_parallel == 0, "policy.tensor_parallel", p.tensor_parallel,
                 f"must divide cluster.train_ranks={c.train_ranks}")
        _require(p.heads % p.tensor_parallel == 0 and 128 % p.tensor_parallel == 0, "policy.tensor_parallel",
                 p.tensor_parallel, f"must divide policy.heads={p.heads} and 128 (the LM vocabulary is padded to a multiple of 128)")
        _require(m.placement == "disaggregated", "mode.placement", m.placement,
                 "lm_backend=megatron needs disaggregated placement (Generators run transformers)")
    _require(p.lora_rank >= 0, "policy.lora_rank", p.lora_rank, "must be >= 0 (0: full fine-tuning)")
    _require(0.1 <= p.image_crop <= 1.0, "policy.image_crop", p.image_crop, "keep a fraction in [0.1, 1] of the frame's area")
    _require(0.01 <= p.flow_noise_std <= 1.0, "policy.flow_noise_std", p.flow_noise_std, "use a std in [0.01, 1]")
    _require(0.0 <= p.flow_start_std <= 1.0, "policy.flow_start_std", p.flow_start_std,
             "use a std in [0, 1] (1: the flow's own start, 0: every chain starts at the origin)")
    for name in ("infer_fixed_ms", "infer_per_sample_ms", "weight_sync_ms"):
        _require(getattr(p, name) >= 0, f"policy.{name}", getattr(p, name), "must be >= 0")
    _require(p.train_samples_per_s > 0, "policy.train_samples_per_s", p.train_samples_per_s, "must be > 0")
    _require(p.emulated_params >= 1, "policy.emulated_params", p.emulated_params, "must be >= 1")
    _require(p.heads >= 1, "policy.heads", p.heads, "must be >= 1")
    _require(p.d_model % p.heads == 0, "policy.d_model", p.d_model, f"must be divisible by policy.heads={p.heads}")
    _require(p.vocab >= 3, "policy.vocab", p.vocab, "must be >= 3 (ids 0 and 1 are padding and end of text)")
    _require(p.instruction_len >= 1, "policy.instruction_len", p.instruction_len, "must be >= 1")
    _require(p.discrete_state_input or p.name == "pi05", "policy.discrete_state_input", p.discrete_state_input,
             f"only pi05 writes its state into the prompt; policy={p.name} reads the proprio as a token: drop the override")
    if p.name == "pi05" and not p.pretrained and p.discrete_state_input:   # the prompt carries the state: the env's proprio must fit
        proprio_dim = env_dims(cfg).proprio_dim
        need = hashed_pi05_min_length(proprio_dim)
        _require(p.instruction_len >= need, "policy.instruction_len", p.instruction_len,
                 f"a random-initialised pi05's prompt holds the task, the {proprio_dim} state values as "
                 f"digits (up to 4 words each) and 4 fixed words: give at least {need} (more for a longer instruction)")
    _require_path(p.init_from, "policy.init_from", "a checkpoint file (.pt)", want_dir=False)
    _require_path(interpreter(cfg), "env.python", "an interpreter of the env's virtual environment (<venv>/bin/python)",
                  want_dir=False)
    _require(not e.python or os.access(interpreter(cfg), os.X_OK), "env.python", e.python, "is not executable")
    _require_path(p.pretrained, "policy.pretrained", "a local checkpoint folder (config.json + weights)", want_dir=True)
    if p.pretrained:
        _validate_pretrained(cfg)
    _require(2 <= p.action_bins <= 65536, "policy.action_bins", p.action_bins, "use 2..65536 bins")
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", p.device) is not None, "policy.device", p.device, "use auto, cpu, cuda or cuda:N")
    _require(p.torch_threads >= 1, "policy.torch_threads", p.torch_threads, "must be >= 1")
    _require(a.name in ("ppo", "grpo", "raft", "vtrace"), "algo.name", a.name, "use ppo, grpo, raft or vtrace")
    _require(a.kl_coef >= 0, "algo.kl_coef", a.kl_coef, "must be >= 0")
    _require(a.lr > 0, "algo.lr", a.lr, "must be > 0")
    _require(a.clip > 0, "algo.clip", a.clip, "must be > 0")
    _require(a.ratio in ("sequence", "token"), "algo.ratio", a.ratio, "use sequence or token")
    if a.ratio == "token":
        _require(a.name != "vtrace", "algo.ratio", a.ratio,
                 "algo.name=vtrace weighs whole samples in its targets: use algo.ratio=sequence, or ppo/grpo")
    _require(a.vtrace_rho_clip > 0 and a.vtrace_c_clip > 0, "algo.vtrace_rho_clip", a.vtrace_rho_clip,
             "V-trace clips must be > 0")
    if episodic(cfg):
        _require(a.segment_steps * p.chunk >= e.horizon, "algo.segment_steps", a.segment_steps,
                 f"{'evaluation' if cfg.runtime.evaluate else a.name} uses whole episodes: a segment must hold one "
                 f"(algo.segment_steps * policy.chunk >= env.horizon={e.horizon})")
    if a.name in OUTCOME_ALGOS:
        _require(a.vf_coef == 0, "algo.vf_coef", a.vf_coef,
                 f"{a.name} has no critic: set algo.vf_coef=0 (conf/algo/{a.name}.yaml does)")
    _require(a.segment_steps >= 1, "algo.segment_steps", a.segment_steps, "must be >= 1")
    seg = e.num_envs * a.segment_steps
    _require(a.rollout_batch >= seg and a.rollout_batch % seg == 0, "algo.rollout_batch", a.rollout_batch,
             f"must be a positive multiple of env.num_envs * algo.segment_steps = {seg}")
    _require(a.global_batch >= 1 and a.rollout_batch % a.global_batch == 0, "algo.global_batch", a.global_batch,
             f"must divide algo.rollout_batch={a.rollout_batch}")
    _require(1 <= a.micro_batch <= a.global_batch, "algo.micro_batch", a.micro_batch,
             f"must be in 1..algo.global_batch={a.global_batch}")
    _require(a.update_epochs >= 1, "algo.update_epochs", a.update_epochs, "must be >= 1")
    _require(a.max_versions >= 1, "algo.max_versions", a.max_versions, "must be >= 1")
    _require(a.lr_warmup_steps >= 0, "algo.lr_warmup_steps", a.lr_warmup_steps, "must be >= 0 (0: no warm-up)")
    _require(0 < a.gamma <= 1 and 0 <= a.gae_lambda <= 1, "algo.gamma", a.gamma, "gamma in (0,1], gae_lambda in [0,1]")
    _require(a.behaviour_clip >= 1, "algo.behaviour_clip", a.behaviour_clip, "must be >= 1")
    _require(m.eta >= 0, "mode.eta", m.eta, "must be >= 0")
    _require(m.overlap or not m.streaming, "mode.streaming", m.streaming,
             "streaming needs mode.overlap=true (micro-batches are trained as their shards arrive)")
    _require(m.placement in ("disaggregated", "colocated"), "mode.placement", m.placement, "use disaggregated or colocated")
    _require(c.sim_ranks >= 1, "cluster.sim_ranks", c.sim_ranks, "must be >= 1")
    _require(c.gen_ranks >= 1, "cluster.gen_ranks", c.gen_ranks, "must be >= 1")
    _require(c.train_ranks >= 1, "cluster.train_ranks", c.train_ranks, "must be >= 1")
    if m.placement == "colocated":
        _require(c.train_ranks == c.gen_ranks, "cluster.train_ranks", c.train_ranks,
                 f"colocated placement puts one Trainer on each Generator rank: set it to cluster.gen_ranks={c.gen_ranks}")
    _require(cfg.generator.b_max >= 1, "generator.b_max", cfg.generator.b_max, "must be >= 1")
    _require(cfg.generator.t_max_ms >= 0, "generator.t_max_ms", cfg.generator.t_max_ms, "must be >= 0")
    _require(cfg.generator.weights_dtype in ("float32", "bfloat16"), "generator.weights_dtype",
             cfg.generator.weights_dtype, "use float32 or bfloat16")
    _require(cfg.generator.weights_fanout >= 0, "generator.weights_fanout", cfg.generator.weights_fanout,
             "must be >= 0 (0: Trainer 0 sends to every Generator; k: a k-ary relay tree)")
    _require(cfg.generator.weights_bucket_mb > 0, "generator.weights_bucket_mb", cfg.generator.weights_bucket_mb,
             "must be > 0")
    _require(0 <= cfg.generator.adapt_batch <= min(cfg.generator.b_max, p.max_batch), "generator.adapt_batch",
             cfg.generator.adapt_batch, "use 0 (off) or a target batch <= min(generator.b_max, policy.max_batch)")
    if c.name != "local":
        validate_slurm(cfg)
    plan = sharding_plan(cfg)
    _require(len(plan) == c.sim_ranks, "sharding.plan", s.plan, f"needs one list per Simulator rank (cluster.sim_ranks={c.sim_ranks})")
    _require(all(len(r) >= 1 and all(k >= 1 for k in r) for r in plan), "sharding.plan", plan,
             f"every Simulator rank needs >= 1 group of >= 1 env; env.num_envs={e.num_envs} may be < cluster.sim_ranks={c.sim_ranks}")
    _require(sum(map(sum, plan)) == e.num_envs, "sharding.plan", plan, f"group sizes must add up to env.num_envs={e.num_envs}")
    b_max = min(cfg.generator.b_max, p.max_batch)
    if a.name == "grpo":
        _require(min(map(min, plan)) >= 2, "sharding.plan", plan,
                 "grpo compares the episodes of one env group (same initial state): every group needs >= 2 envs")
    _require(max(map(max, plan)) <= b_max, "sharding.plan", plan,
             f"a group larger than the batch limit min(generator.b_max, policy.max_batch)={b_max} could never be served")
    _require(len(plan) and sum(len(r) for r in plan) >= c.gen_ranks, "cluster.gen_ranks", c.gen_ranks,
             "more Generators than env groups would leave a Generator idle")
    validate_runtime(cfg.runtime)
    validate_eval(cfg)
    _require(sum(len(r) for r in plan) < 30000, "sharding.plan", "too many groups", "keep under 30000 groups (MPI tag range)")


def validate_runtime(rt) -> None:
    """runtime.*: timeouts, checkpointing, logging and the choices of its string fields."""
    for name in ("heartbeat_interval", "startup_timeout", "shutdown_timeout", "max_wall"):
        _require(getattr(rt, name) > 0, f"runtime.{name}", getattr(rt, name), "must be > 0 (seconds)")
    _require(rt.wandb_mode in ("online", "offline"), "runtime.wandb_mode", rt.wandb_mode, "use online or offline")
    _require(not rt.wandb or importlib.util.find_spec("wandb") is not None, "runtime.wandb", rt.wandb,
             "needs the wandb package: pip install -e '.[wandb]' (or runtime.wandb=false)")
    _require(rt.ckpt_every >= 1, "runtime.ckpt_every", rt.ckpt_every, "must be >= 1 (checkpoint every N versions)")
    for name, choices in (("shard_codec", SHARD_CODECS), ("wake", WAKES), ("obs_compression", OBS_COMPRESSIONS)):
        _require(getattr(rt, name) in choices, f"runtime.{name}", getattr(rt, name), f"use one of {', '.join(choices)}")
    _require(rt.max_idle_wait > 0, "runtime.max_idle_wait", rt.max_idle_wait, "use a positive number of seconds")
    _require(rt.spin_us >= 0, "runtime.spin_us", rt.spin_us, "use 0 (wait at once) or more microseconds")
    _require(rt.expect_spin_us >= 0, "runtime.expect_spin_us", rt.expect_spin_us, "use 0 (never) or more microseconds")
    _require(rt.liveness_timeout > 2 * rt.heartbeat_interval, "runtime.liveness_timeout",
             rt.liveness_timeout, "must exceed 2 * runtime.heartbeat_interval")


def validate_eval(cfg: RunConfig) -> None:
    """runtime.eval_every and its settings (evaluation while training)."""
    rt = cfg.runtime
    _require(not cfg.generator.greedy or rt.evaluate, "generator.greedy", cfg.generator.greedy,
             "evaluation only (python -m rlvla3.evaluate --greedy): RL learns from sampled actions and their log-probs")
    _require(rt.eval_every >= 0, "runtime.eval_every", rt.eval_every, "must be >= 0 (0: no evaluation while training)")
    if not rt.eval_every:
        return
    _require(cfg.policy.name != "emulated", "runtime.eval_every", rt.eval_every,
             "needs a policy with weights to evaluate (policy=emulated has none); set runtime.eval_every=0")
    _require(not rt.evaluate, "runtime.eval_every", rt.eval_every, "an evaluation run does not evaluate itself again")
    for name in ("eval_episodes", "eval_envs"):
        _require(getattr(rt, name) >= 1, f"runtime.{name}", getattr(rt, name), "must be >= 1")
    _require(rt.eval_videos >= 0, "runtime.eval_videos", rt.eval_videos, "must be >= 0 (0: no videos)")
    _require(rt.eval_timeout > 0, "runtime.eval_timeout", rt.eval_timeout, "must be > 0 (seconds)")


SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # what may reach an #SBATCH line unquoted
SLURM_TIME = re.compile(r"\d+|\d+:\d{2}(:\d{2})?|\d+-\d+(:\d{2}(:\d{2})?)?")


def gpu_ranks(cfg: RunConfig) -> int:
    """Ranks of the GPU component: one GPU each (colocated: Generator and Trainer share it)."""
    c = cfg.cluster
    return c.gen_ranks + (0 if cfg.mode.placement == "colocated" else c.train_ranks)


def validate_slurm(cfg: RunConfig) -> None:
    """Site settings of a Slurm cluster, checked before anything is submitted."""
    c = cfg.cluster
    _require(SLURM_NAME.fullmatch(c.name) is not None, "cluster.name", c.name, "use letters, digits, _ . + -")
    for name in ("cpu_partition", "gpu_partition"):
        v = getattr(c, name)
        _require(SLURM_NAME.fullmatch(v) is not None, f"cluster.{name}", v,
                 "set the Slurm partition name (letters, digits, _ . + -), e.g. in conf/site/local.yaml")
    for name in ("account", "qos"):
        v = getattr(c, name)
        _require(v == "" or SLURM_NAME.fullmatch(v) is not None, f"cluster.{name}", v,
                 "use letters, digits, _ . + - (or empty for the default)")
    _require(SLURM_TIME.fullmatch(c.time) is not None, "cluster.time", c.time,
             "use Slurm's format: MM, HH:MM:SS or D-HH:MM:SS")
    _require(SLURM_NAME.fullmatch(c.mpi) is not None, "cluster.mpi", c.mpi, "name an srun --mpi plugin, e.g. pmix")
    _require(c.gpus_per_node >= 1, "cluster.gpus_per_node", c.gpus_per_node, "must be >= 1")
    g = gpu_ranks(cfg)
    _require(g <= c.gpus_per_node or g % c.gpus_per_node == 0, "cluster.gen_ranks", c.gen_ranks,
             f"Generator + Trainer GPUs ({g}) must fill whole nodes of cluster.gpus_per_node={c.gpus_per_node} "
             "(or fit in one)")
    per_node = min(g, c.gpus_per_node)
    _require(1 <= c.cpus_per_gpu_rank and per_node * c.cpus_per_gpu_rank <= c.cores_per_gpu_node,
             "cluster.cpus_per_gpu_rank", c.cpus_per_gpu_rank,
             f"{per_node} GPU ranks per node x this must fit cluster.cores_per_gpu_node={c.cores_per_gpu_node}")
    _require(1 <= c.cpus_per_sim_rank <= c.cores_per_cpu_node, "cluster.cpus_per_sim_rank", c.cpus_per_sim_rank,
             f"must be in 1..cluster.cores_per_cpu_node={c.cores_per_cpu_node}")
    _require(c.signal_delay_s >= 10, "cluster.signal_delay_s", c.signal_delay_s,
             "leave the Trainer >= 10 s to checkpoint before the time limit")
    _require(c.max_requeues >= 0, "cluster.max_requeues", c.max_requeues, "must be >= 0")
    _require(c.poll_s > 0, "cluster.poll_s", c.poll_s, "must be > 0")
    for line in c.setup:
        _require("\n" not in line, "cluster.setup", line, "one shell line per list entry")



def plan_table(world: World) -> str:
    """The sharding plan as a table, printed at start-up."""
    lines = ["group  sim_rank  envs  env_ids      generator_rank"]
    for g in world.groups:
        ids = f"{g.env_offset}..{g.env_offset + g.size - 1}"
        lines.append(f"{g.gid:5d}  {g.sim_rank:8d}  {g.size:4d}  {ids:11s}  {world.gen_rank_of(g):14d}")
    return "\n".join(lines)

