"""The configuration schema: every default of rlvla3 lives here, and only here.

Hydra composes `conf/` (whose YAML files are diffs against this schema) into a `RunConfig`.
Role code reads typed fields; it never calls `cfg.get(key, default)`. Values derived from the
user's values (the world layout, the sharding plan, rollout-step arithmetic) get their own names
in `Derived` and are never written back into the user's fields.

Definitions used throughout (also in README.md):
- a *rollout step* is `algo.rollout_batch` samples (env transitions);
- it is trained as `update_epochs * rollout_batch / global_batch` optimizer steps;
- a *version* is the weights published after a rollout step; the Trainer trains rollout step k
  with version k and then publishes version k + 1;
- η (`mode.eta`) counts versions: a sample used in rollout step k was produced by version ≥ k - η;
- π_prox (the proximal policy of decoupled PPO) is the weights at the start of the rollout step;
- a *segment* is `algo.segment_steps` consecutive steps of one env group; a segment cut mid-episode
  stores the bootstrap value V(s_T) of the observation that follows it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

ROLES = ("simulator", "generator", "trainer")


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and how to fix it."""


@dataclass(frozen=True)
class EnvConfig:
    name: str = "robosuite"
    """Env adapter: toy | emulated | robosuite | metaworld | robocasa (optional install)."""
    task: str = "Lift"
    """Task inside the adapter (robosuite: Lift, Stack, ...; metaworld: pick-place-v3, ...; toy/emulated: ignored)."""
    num_envs: int = 2
    """Total number of envs across all Simulator ranks."""
    horizon: int = 64
    """Episode length limit in env steps; an episode cut here is truncated."""
    image_size: int = 64
    """Square camera resolution in pixels."""
    cameras: list[str] = field(default_factory=lambda: ["agentview"])
    """Camera names (robosuite: agentview, robot0_eye_in_hand, ...; metaworld: corner2, ...); one image each."""
    robot: str = "Panda"
    """robosuite robot."""
    control_freq: int = 20
    """robosuite control frequency (Hz)."""
    arm_controller: str = "OSC_POSE"
    """robosuite arm controller: OSC_POSE (action 7-D: end-effector position delta 3, axis-angle
    delta 3, gripper) | OSC_POSITION (action 4-D: position delta 3, gripper; the hand keeps its
    reset orientation). Tasks whose expert turns the hand (Door) need OSC_POSE."""
    fast_render: bool = True
    """robosuite/metaworld: MSAA and reflections (metaworld: also shadows, skybox) off; several times
    faster on CPU; false gives the stock look."""
    instruction: str = ""
    """Instruction string; empty means the adapter's default for the task."""
    step_timeout: float = 60.0
    """Seconds a child env process may take for one step before it is killed and restarted."""
    reset_timeout: float = 120.0
    """Seconds a child env process may take to start or reset before it is killed and restarted."""
    in_process: bool = False
    """Run envs inside the Simulator rank instead of one spawned child per env (toy/emulated)."""
    grid: int = 4
    """toy: grid side in cells."""
    distractors: int = 1
    """toy: targets of other colours besides the named one (0 makes language unnecessary)."""
    step_ms: float = 10.0
    """emulated: median step latency (ms); episodes last exactly `horizon` steps."""
    step_sigma: float = 0.6
    """emulated: log-normal sigma of step latency (heavy tail)."""
    reset_ms: float = 200.0
    """emulated: reset latency (ms), paid at each episode end."""
    success_rate: float = 0.2
    """emulated: probability that an episode ends in success (decided at its last step)."""
    proprio_dim: int = 8
    """emulated: proprio size."""
    action_dim: int = 7
    """emulated: action size."""


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "tiny"
    """Policy family (rlvla3/policies): tiny (plain torch) | openvla (SigLIP + Qwen2/Llama,
    discrete action tokens) | pi0 (transformers' PI0: flow-matching action expert) | emulated
    (sleeps for the costs below; no torch)."""
    chunk: int = 1
    """Actions per forward (action chunking, OpenVLA-OFT/π0 style). The Simulator executes the K
    actions of a chunk, one env step each, and records one row per chunk: its reward is the sum
    over the steps executed, log-prob and advantage are per chunk (a chunk-level MDP)."""
    decoding: str = "parallel"
    """openvla: parallel (all K*D action tokens from one forward, OpenVLA-OFT) | autoregressive
    (one token per forward with a KV cache, OpenVLA)."""
    lm: str = "qwen2"
    """openvla: the language model class (transformers): qwen2 | llama."""
    denoise_steps: int = 4
    """pi0: denoising steps per action chunk (each one a Gaussian transition, see flow_noise_std)."""
    flow_noise_std: float = 0.2
    """pi0: initial std of the noise injected at each denoising step (learned per action dim,
    kept in [0.01, 1]); it makes every step a Gaussian with a tractable log-probability."""
    lm_backend: str = "transformers"
    """openvla with lm=llama: the Trainer's language model, transformers | megatron (megatron-core
    GPTModel split over policy.tensor_parallel Trainer ranks; published weights are converted back
    to the transformers layout, so Generators are unchanged)."""
    tensor_parallel: int = 1
    """lm_backend=megatron: Trainer ranks per model replica (cluster.train_ranks must be a
    multiple; the replicas are data parallel)."""
    init_from: str = ""
    """A checkpoint (.pt: a run's ckpt/v*.pt or python -m rlvla3.sft's output) whose model weights
    the run starts from, e.g. an SFT warm start; empty: random init (or policy.pretrained)."""
    pretrained: str = ""
    """openvla/pi0: a local directory with a transformers checkpoint (config.json + weights) to
    start from instead of random weights; nothing is downloaded."""
    d_model: int = 128
    """Transformer width."""
    layers: int = 2
    """Transformer layers."""
    heads: int = 4
    """Attention heads."""
    patch: int = 8
    """Image patch size in pixels."""
    action_bins: int = 256
    """Discrete bins per action dimension (OpenVLA style); bin centres span [-1, 1]."""
    vocab: int = 512
    """Instruction vocabulary (hashed words)."""
    instruction_len: int = 16
    """Instruction tokens per sample (padded/truncated)."""
    max_batch: int = 64
    """Largest batch the policy forward accepts; the Generator's B_max never exceeds it."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N. auto picks the rank's GPU when one is present."""
    torch_threads: int = 1
    """torch threads per CPU rank (1 is fastest when several ranks share cores)."""
    init_seed: int = 0
    """Seed of the initial weights."""
    infer_fixed_ms: float = 5.0
    """emulated: Generator forward of n samples takes infer_fixed_ms + infer_per_sample_ms * n."""
    infer_per_sample_ms: float = 0.5
    """emulated: per-sample part of the forward time."""
    train_samples_per_s: float = 2000.0
    """emulated: rollout samples per second one Trainer rank trains (all update epochs)."""
    weight_sync_ms: float = 20.0
    """emulated: Trainer time to publish a version (on top of the real transfer)."""
    emulated_params: int = 100_000
    """emulated: float32 values really sent to every Generator per version."""


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "ppo"
    """ppo: GAE advantages with a critic, decoupled PPO objective for stale samples |
    grpo: outcome (success 1/0) normalised within a group of episodes from one initial state, no critic |
    vtrace: V-trace advantages and value targets (IMPALA) under the clipped PPO objective."""
    lr: float = 3e-4
    """Adam learning rate."""
    lr_warmup_steps: int = 0
    """Optimizer steps over which the learning rate ramps up linearly to lr (Adam's first steps
    move every weight by about lr whatever its gradient: a warm-started policy jumps without it)."""
    lr_decay: bool = False
    """Decay the learning rate linearly to 0 at the last optimizer step of algo.max_versions, so
    that the run's last versions differ little and its final checkpoint is not a noisy draw."""
    gamma: float = 0.99
    """Discount."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip: float = 0.2
    """PPO ratio clip epsilon."""
    behaviour_clip: float = 2.0
    """Decoupled PPO: cap on the behaviour weight pi_prox / pi_behav."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    kl_coef: float = 0.0
    """Weight of a KL penalty to the reference policy (the initial weights; k3 estimator)."""
    vtrace_rho_clip: float = 1.0
    """vtrace: clip rho-bar of the importance weights in the value targets and advantages."""
    vtrace_c_clip: float = 1.0
    """vtrace: clip c-bar of the trace-cutting weights."""
    check_logprobs: bool = False
    """Recompute log-probs of fresh rows with the producing weights and log the largest
    difference to the Generator's (scalar logp_diff_max): a cheap check that catches most RL bugs."""
    norm_adv: bool = True
    """Normalise advantages to zero mean, unit std over each optimizer step's global batch
    (statistics all-reduced over Trainers, so data parallelism does not change them)."""
    max_grad_norm: float = 1.0
    """Gradient clipping (0 disables)."""
    segment_steps: int = 32
    """Steps per trajectory segment (one shard per group and segment)."""
    rollout_batch: int = 128
    """Samples per rollout step; a multiple of num_envs * segment_steps."""
    global_batch: int = 64
    """Samples per optimizer step; divides rollout_batch."""
    micro_batch: int = 32
    """Samples per forward/backward pass; gradients accumulate to global_batch."""
    update_epochs: int = 1
    """PPO epochs over each rollout step."""
    max_versions: int = 4
    """Stop after this many versions (rollout steps trained)."""


@dataclass(frozen=True)
class ModeConfig:
    name: str = "async"
    """Label for this mode (sync | async | a ladder rung); the switches below define it."""
    env_level: bool = True
    """Every env group loops on its own (dynamic batching). Off: all groups advance in lockstep."""
    overlap: bool = True
    """The Trainer ingests shards (reads, GAE) while rollout goes on. Off: after the whole step."""
    streaming: bool = True
    """The Trainer starts optimizer steps as soon as a global batch of rows is in."""
    eta: int = 1
    """Bounded staleness in versions (0 = per-step weight barrier)."""
    placement: str = "disaggregated"
    """disaggregated: Generators and Trainers are separate ranks; colocated: each Generator rank
    also hosts a Trainer and alternates between them."""


@dataclass(frozen=True)
class GeneratorConfig:
    b_max: int = 16
    """Dynamic batcher: close a batch at this many samples (capped at policy.max_batch)."""
    t_max_ms: float = 5.0
    """Dynamic batcher: close a batch this long after its first request arrived (with
    adapt_batch: the longest window the tuner may choose)."""
    weights_dtype: str = "float32"
    """Wire format of published weights: float32, or bfloat16 (half the bytes, relative error
    <= 2^-8; the Generator widens them back to float32)."""
    weights_bucket_mb: float = 64.0
    """Published weights travel in buckets of at most this many MiB (one MPI message each)."""
    adapt_batch: int = 0
    """Online batching window: 0 keeps t_max_ms fixed; N > 0 re-tunes the window 4x a second to
    the time N samples take to arrive at the observed rate (logged as scalar t_max_ms)."""


@dataclass(frozen=True)
class ShardingConfig:
    strategy: str = "pipelined"
    """per_env | pipelined | aggregated; ignored when `plan` is given."""
    groups_per_rank: int = 2
    """pipelined: env groups per Simulator rank."""
    plan: list[list[int]] = field(default_factory=list)
    """Explicit group sizes per Simulator rank, e.g. [[2, 2], [3]]; overrides strategy."""


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "local"
    """local (mpiexec on this machine); any other name is a Slurm cluster (conf/cluster/slurm_*.yaml)."""
    sim_ranks: int = 1
    """Simulator ranks."""
    gen_ranks: int = 1
    """Generator ranks (one per GPU on a cluster)."""
    train_ranks: int = 1
    """Data-parallel Trainer ranks (colocated placement: must equal gen_ranks)."""
    mpiexec: str = "mpiexec"
    """MPI launcher for local runs."""
    mpiexec_args: list[str] = field(default_factory=lambda: ["--oversubscribe"])
    """Extra launcher arguments (as root, --allow-run-as-root is added automatically)."""
    cores: int = 0
    """Cores available to the run (0 = this machine's count); used for oversubscription warnings."""
    # ---- Slurm (any name but "local"): one heterogeneous job, component 0 = Simulators on CPU
    # nodes, component 1 = Generators + Trainers on GPU nodes, one MPI world over both. Site
    # settings (partitions, account, qos, mpi, setup) are meant to be set once, e.g. in a
    # git-ignored conf/site/local.yaml (see slurm/README.md).
    cpu_partition: str = ""
    """Slurm partition of the Simulator component."""
    gpu_partition: str = ""
    """Slurm partition of the Generator/Trainer component."""
    account: str = ""
    """Slurm account (empty: the user's default)."""
    qos: str = ""
    """Slurm QOS (empty: the partition's default)."""
    time: str = "01:00:00"
    """Job time limit, Slurm format: MM, HH:MM:SS or D-HH[:MM[:SS]]."""
    gpus_per_node: int = 8
    """GPUs per GPU node; each Generator/Trainer rank gets one GPU."""
    cores_per_cpu_node: int = 64
    """Cores per CPU node."""
    cores_per_gpu_node: int = 64
    """Cores per GPU node."""
    cpus_per_sim_rank: int = 8
    """Cores per Simulator rank (its env child processes run on them)."""
    cpus_per_gpu_rank: int = 4
    """Cores per Generator/Trainer rank."""
    mpi: str = "pmix"
    """srun --mpi plugin (sites differ: pmix, pmi2, ...)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run in the batch script before srun (module load ..., source venv/bin/activate)."""
    signal_delay_s: int = 120
    """Seconds before the time limit that Slurm sends USR2 (Trainer checkpoints, job requeues)."""
    max_requeues: int = 3
    """How many times a preempted or timed-out job is requeued."""
    poll_s: float = 10.0
    """Longest pause between sacct polls while waiting for a job (bounds failure detection)."""
    dry_run: bool = False
    """Print the sbatch text that would be submitted, and submit nothing."""


@dataclass(frozen=True)
class RuntimeConfig:
    liveness_timeout: float = 30.0
    """A peer silent this long (seconds) aborts the job, naming the rank."""
    heartbeat_interval: float = 1.0
    """Seconds between heartbeats to each peer."""
    startup_timeout: float = 300.0
    """Seconds a rank may wait for peers at start-up (env processes can be slow to start)."""
    shutdown_timeout: float = 60.0
    """Seconds the clean-shutdown handshake may take."""
    ckpt_every: int = 1
    """Checkpoint every N versions (and at the end)."""
    keep_shards: bool = True
    """Keep consumed shards (for replay and analysis) or delete them after their step."""
    idle_sleep: float = 0.0005
    """Shortest sleep of a rank with nothing to do; doubles up to max_idle_sleep."""
    max_idle_sleep: float = 0.005
    """Longest idle sleep (bounds added latency)."""
    tensorboard: bool = True
    """Trainer rank 0 writes TensorBoard scalars under tb/."""
    progress: bool = True
    """Trainer rank 0 prints a progress line per version."""
    evaluate: bool = False
    """No optimizer steps: weights never change, and every segment is one whole episode of each
    env from its own seed (python -m rlvla3.evaluate sets it)."""
    max_wall: float = 86400.0
    """Seconds the launcher waits for the whole job before killing it."""


@dataclass(frozen=True)
class RunConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    mode: ModeConfig = field(default_factory=ModeConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    seed: int = 0
    """Seed for envs and action sampling."""
    run_dir: str = ""
    """Run folder; empty means the Hydra output folder (runs/<date>/<time>)."""
    resume: bool = False
    """Continue the run in run_dir from its latest checkpoint."""


# ---------------------------------------------------------------- derived values


@dataclass(frozen=True)
class Group:
    """One env group: `size` envs on Simulator rank `sim_rank`, served by Generator `gen_index`."""

    gid: int
    sim_rank: int
    size: int
    env_offset: int
    gen_index: int


@dataclass(frozen=True)
class Derived:
    """Values computed from the user's config; role code reads these, never recomputes them."""

    world_size: int
    sim_ranks: tuple[int, ...]
    gen_ranks: tuple[int, ...]
    train_ranks: tuple[int, ...]
    groups: tuple[Group, ...]
    segments_per_step: int
    """Segments each group contributes to one rollout step."""
    opt_steps_per_version: int
    b_max: int

    def role_of(self, rank: int) -> list[str]:
        roles = [r for r, ranks in zip(ROLES, (self.sim_ranks, self.gen_ranks, self.train_ranks)) if rank in ranks]
        return roles

    def groups_of_sim(self, rank: int) -> list[Group]:
        return [g for g in self.groups if g.sim_rank == rank]

    def groups_of_gen(self, gen_index: int) -> list[Group]:
        return [g for g in self.groups if g.gen_index == gen_index]


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


def episodic(cfg: RunConfig) -> bool:
    """Whole episodes per segment (grpo, evaluation): every env of a group resets at each segment
    start (`shared_reset`: all from one seed), and an env whose episode ended waits for that reset."""
    return cfg.algo.name == "grpo" or cfg.runtime.evaluate


def shared_reset(cfg: RunConfig) -> bool:
    """grpo training: a group's envs reset from one seed (`group_seed`), so a GRPO group is one
    initial state. Never in evaluation: there each env resets from its own seeds, so N episodes
    are N distinct initial states, as the Wilson interval assumes."""
    return cfg.algo.name == "grpo" and not cfg.runtime.evaluate


def group_seed(cfg: RunConfig, gid: int, seq: int) -> int:
    """The shared reset seed of group `gid`'s segment `seq` (episodic mode)."""
    return (cfg.seed * 1_000_003 + gid * 100_003 + seq * 7 + 1) % (2**31 - 1)


def derive(cfg: RunConfig) -> Derived:
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
    seg_samples = cfg.env.num_envs * cfg.algo.segment_steps
    b_max = min(cfg.generator.b_max, cfg.policy.max_batch)
    return Derived(
        world_size=len(sims) + len(gens) + (0 if colocated else len(trains)),
        sim_ranks=sims,
        gen_ranks=gens,
        train_ranks=trains,
        groups=tuple(groups),
        segments_per_step=cfg.algo.rollout_batch // seg_samples,
        opt_steps_per_version=cfg.algo.update_epochs * cfg.algo.rollout_batch // cfg.algo.global_batch,
        b_max=b_max,
    )


def _require(ok: bool, name: str, value, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {fix}")


def validate(cfg: RunConfig) -> None:
    """Check every field a run depends on; the first bad one raises ConfigError."""
    e, p, a, m, c, s = cfg.env, cfg.policy, cfg.algo, cfg.mode, cfg.cluster, cfg.sharding
    _require(e.name in ("toy", "emulated", "robosuite", "metaworld", "robocasa"), "env.name", e.name,
             "use toy, emulated, robosuite, metaworld or robocasa")
    _require(e.num_envs >= 1, "env.num_envs", e.num_envs, "must be >= 1")
    _require(e.arm_controller in ("OSC_POSE", "OSC_POSITION"), "env.arm_controller", e.arm_controller,
             "use OSC_POSE or OSC_POSITION")
    _require(e.arm_controller == "OSC_POSE" or e.name == "robosuite", "env.arm_controller", e.arm_controller,
             f"only env.name=robosuite can change its arm controller (env.name={e.name!r})")
    _require(e.horizon >= 1, "env.horizon", e.horizon, "must be >= 1")
    _require(e.image_size % p.patch == 0, "env.image_size", e.image_size, f"must be a multiple of policy.patch={p.patch}")
    _require(len(e.cameras) >= 1, "env.cameras", e.cameras, "name at least one camera")
    _require(e.step_timeout > 0 and e.reset_timeout > 0, "env.step_timeout", e.step_timeout, "timeouts must be > 0")
    _require(0.0 <= e.success_rate <= 1.0, "env.success_rate", e.success_rate, "must be in [0, 1]")
    _require(p.name in ("tiny", "openvla", "pi0", "emulated"), "policy.name", p.name, "use tiny, openvla, pi0 or emulated")
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
    _require(0.01 <= p.flow_noise_std <= 1.0, "policy.flow_noise_std", p.flow_noise_std, "use a std in [0.01, 1]")
    for name in ("infer_fixed_ms", "infer_per_sample_ms", "weight_sync_ms"):
        _require(getattr(p, name) >= 0, f"policy.{name}", getattr(p, name), "must be >= 0")
    _require(p.train_samples_per_s > 0, "policy.train_samples_per_s", p.train_samples_per_s, "must be > 0")
    _require(p.emulated_params >= 1, "policy.emulated_params", p.emulated_params, "must be >= 1")
    _require(p.d_model % p.heads == 0, "policy.d_model", p.d_model, f"must be divisible by policy.heads={p.heads}")
    _require(2 <= p.action_bins <= 65536, "policy.action_bins", p.action_bins, "use 2..65536 bins")
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", p.device) is not None, "policy.device", p.device, "use auto, cpu, cuda or cuda:N")
    _require(p.torch_threads >= 1, "policy.torch_threads", p.torch_threads, "must be >= 1")
    _require(a.name in ("ppo", "grpo", "vtrace"), "algo.name", a.name, "use ppo, grpo or vtrace")
    _require(a.kl_coef >= 0, "algo.kl_coef", a.kl_coef, "must be >= 0")
    _require(a.vtrace_rho_clip > 0 and a.vtrace_c_clip > 0, "algo.vtrace_rho_clip", a.vtrace_rho_clip,
             "V-trace clips must be > 0")
    if a.name == "grpo" or cfg.runtime.evaluate:
        _require(a.segment_steps * p.chunk >= e.horizon, "algo.segment_steps", a.segment_steps,
                 f"grpo and evaluation use whole episodes: a segment must hold one (algo.segment_steps * "
                 f"policy.chunk >= env.horizon={e.horizon})")
    if a.name == "grpo":
        _require(a.vf_coef == 0, "algo.vf_coef", a.vf_coef, "grpo has no critic: set algo.vf_coef=0 (conf/algo/grpo.yaml does)")
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
    _require(cfg.runtime.liveness_timeout > 2 * cfg.runtime.heartbeat_interval, "runtime.liveness_timeout",
             cfg.runtime.liveness_timeout, "must exceed 2 * runtime.heartbeat_interval")
    _require(sum(len(r) for r in plan) < 30000, "sharding.plan", "too many groups", "keep under 30000 groups (MPI tag range)")


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
                 "set the Slurm partition name (letters, digits, _ . + -), e.g. in conf/local/site.yaml")
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


# ---------------------------------------------------------------- loading


def _writable(node) -> None:
    """Frozen dataclasses give read-only OmegaConf nodes; merging user values needs them writable."""
    from omegaconf import DictConfig

    node._set_flag("readonly", None)
    if isinstance(node, DictConfig):
        for key in node.keys():
            _writable(node._get_node(key))


def to_config(obj) -> RunConfig:
    """An OmegaConf/dict config -> RunConfig, with type checks from the schema."""
    from omegaconf import OmegaConf

    base = OmegaConf.structured(RunConfig)
    _writable(base)
    return OmegaConf.to_object(OmegaConf.merge(base, obj))


def load(run_dir: str | Path) -> RunConfig:
    """The resolved config a launcher wrote into the run folder."""
    from omegaconf import OmegaConf

    return to_config(OmegaConf.load(Path(run_dir) / "config.yaml"))


def save(cfg: RunConfig, run_dir: str | Path) -> None:
    from omegaconf import OmegaConf

    OmegaConf.save(OmegaConf.structured(cfg), Path(run_dir) / "config.yaml")


def replace(cfg: RunConfig, **sections) -> RunConfig:
    """Copy of cfg with some sections' fields replaced: replace(cfg, mode={"eta": 0})."""
    out = {}
    for name, fields in sections.items():
        cur = getattr(cfg, name)
        out[name] = dataclasses.replace(cur, **fields) if dataclasses.is_dataclass(cur) else fields
    return dataclasses.replace(cfg, **out)


def plan_table(cfg: RunConfig, d: Derived) -> str:
    """The sharding plan as a table, printed at start-up."""
    lines = ["group  sim_rank  envs  env_ids      generator_rank"]
    for g in d.groups:
        ids = f"{g.env_offset}..{g.env_offset + g.size - 1}"
        lines.append(f"{g.gid:5d}  {g.sim_rank:8d}  {g.size:4d}  {ids:11s}  {d.gen_ranks[g.gen_index]:14d}")
    return "\n".join(lines)
