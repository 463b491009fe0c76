"""The configuration schema: every default of rlvla3 lives here, and only here.

Hydra composes `conf/` (whose YAML files are diffs against this schema) into a `RunConfig`.
Role code reads typed fields; it never calls `cfg.get(key, default)`. Values derived from the
user's values (the MPI world, the sharding plan, rollout-step arithmetic) and the checks of
those values live in `world.py`, under their own names; they are never written back into the
user's fields. This module holds the schema and its loading only.

The words the docstrings use (rollout step, version, η, π_prox, segment) are defined once, in
docs/concepts.md; docs/configuration.md is generated from this module's field docstrings.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A bad configuration value; the message names the field and how to fix it."""


def require(ok: bool, name: str, value, fix: str) -> None:
    """Raise ConfigError naming the field, its value and how to fix it, unless ok."""
    if not ok:
        raise ConfigError(f"{name}={value!r}: {fix}")


@dataclass(frozen=True)
class EnvConfig:
    name: str = "robosuite"
    """Env adapter: toy | emulated | robosuite | metaworld | libero (its own interpreter, env.python) |
    maniskill (its own interpreter) | robocasa (optional install)."""
    task: str = "Lift"
    """Task inside the adapter (robosuite: Lift, Stack, ...; metaworld: pick-place-v3, ...; toy/emulated: ignored)."""
    suite: str = "libero_spatial"
    """libero: libero_spatial | libero_object | libero_goal | libero_10 | libero_90."""
    task_ids: list[int] = field(default_factory=lambda: [0])
    """libero: the suite's tasks this run uses (an episode's task is task_ids[seed % len])."""
    task_sampling: str = "uniform"
    """libero with several task_ids, GRPO: which task a group's next episode runs (engine/curriculum.py):
    uniform | failure (drawn in proportion to each task's recent failure rate, at least
    task_sampling_floor). Every multi-task run records each task's success per version (success_task<t>)."""
    task_sampling_floor: float = 0.1
    """task_sampling=failure: the least weight a task keeps (a learned task is still rehearsed; 1: uniform)."""
    task_sampling_window: int = 32
    """task_sampling=failure: a task's recent failure rate is over its last this many episodes on a Simulator rank."""
    init_states: str = "sampled"
    """libero: sampled (placements drawn from the task's regions, from the reset seed: training,
    disjoint from the evaluation states) | fixed (the suite's 50 fixed states, as evaluated)."""
    settle_steps: int = 10
    """libero: no-op steps at each episode's start so objects settle (not policy steps)."""
    hard_reset: bool = True
    """libero: rebuild the scene's model at every reset, as robosuite and the published evaluation
    scripts do (seconds a reset on 2 cores). false resets the same model (about 11x cheaper): an
    episode after a soft reset is bitwise the hard reset's episode of its seed (tests/envs/test_libero.py;
    docs/results/libero.md)."""
    seed_order: str = "hashed"
    """Episode reset seeds: hashed (spread apart from the run's seed, env id and episode) |
    sequential (the run's episodes from seeds seed, seed+1, ...: env i's k-th episode is
    seed + i + k * num_envs; the LIBERO protocol visits each fixed initial state once so).
    A GRPO group in training resets from one shared seed either way."""
    num_envs: int = 2
    """Total number of envs across all Simulator ranks."""
    horizon: int = 64
    """Episode length limit in env steps; an episode cut here is truncated."""
    image_size: int = 64
    """Square camera resolution in pixels (the policy's image)."""
    image_pipeline: str = "direct"
    """libero: how a rendered frame becomes the policy's image, as a released checkpoint's own
    LIBERO evaluation prepares it (envs/images.py): direct (rendered at env.image_size) | openvla
    (OpenVLA's and OpenVLA-OFT's: rendered at 256, a JPEG round trip, a Lanczos resize, the
    centre 0.9 of the area resized back) | openpi (openpi's π0/π0.5 client: rendered at 256, a
    bilinear resize) | gr00t (GR00T N1.5's: rendered at 256, the centre 0.95 of the side, an
    antialiased bilinear resize)."""
    cameras: list[str] = field(default_factory=lambda: ["agentview"])
    """Camera names (robosuite: agentview, robot0_eye_in_hand, ...; metaworld: corner2, ...); one image each."""
    robot: str = "Panda"
    """robosuite robot."""
    control_freq: int = 20
    """robosuite control frequency (Hz)."""
    arm_controller: str = "OSC_POSE"
    """robosuite/libero arm controller: OSC_POSE (action 7-D: end-effector position delta 3, axis-angle
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
    """Seconds a child env process may take for one reset before it is killed and restarted."""
    start_timeout: float = 600.0
    """Seconds a newly started child env process may take to answer its first reset (spawn,
    imports, the first scene build) before it is killed and restarted. Longer than a reset: the
    children of a job start together and take turns on the node's cores (8 LIBERO children on
    2 cold cores took over 120 s each)."""
    max_failed_starts: int = 3
    """Consecutive times one env's child process may die or time out before it ever answers (a bad
    env.task, a missing simulator, no headless GL) before the job fails instead of restarting it."""
    python: str = ""
    """Interpreter for this env's child processes: another virtual environment whose simulator
    packages conflict with ours (e.g. LIBERO's robosuite 1.4). It needs numpy and the simulator;
    of ours it gets only this source tree, and nothing crosses as a pickle (envs/wire.py).
    Empty: this interpreter."""
    in_process: bool | None = None
    """Run envs inside the Simulator rank (true) or one spawned child per env (false); null: toy and
    emulated in-process, rendering envs in children (false puts toy in children, for fault tests)."""
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

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        require(self.num_envs >= 1, "env.num_envs", self.num_envs, "must be >= 1")
        require(self.seed_order in ("hashed", "sequential"), "env.seed_order", self.seed_order, "use hashed or sequential")
        require(self.arm_controller in ("OSC_POSE", "OSC_POSITION"), "env.arm_controller", self.arm_controller,
                "use OSC_POSE or OSC_POSITION")
        require(self.horizon >= 1, "env.horizon", self.horizon, "must be >= 1")
        require(self.max_failed_starts >= 0, "env.max_failed_starts", self.max_failed_starts, "must be >= 0")
        require(len(self.cameras) >= 1, "env.cameras", self.cameras, "name at least one camera")
        for name in ("step_timeout", "reset_timeout", "start_timeout"):
            require(getattr(self, name) > 0, f"env.{name}", getattr(self, name), "timeouts must be > 0")
        require(0.0 <= self.success_rate <= 1.0, "env.success_rate", self.success_rate, "must be in [0, 1]")
        require(self.init_states in ("sampled", "fixed"), "env.init_states", self.init_states, "use sampled or fixed")
        require(self.task_sampling in ("uniform", "failure"), "env.task_sampling", self.task_sampling, "use uniform or failure")
        require(0.0 < self.task_sampling_floor <= 1.0, "env.task_sampling_floor", self.task_sampling_floor,
                "use a weight in (0, 1] (a task below it would starve)")
        require(self.task_sampling_window >= 1, "env.task_sampling_window", self.task_sampling_window, "must be >= 1 episodes")
        require(self.settle_steps >= 0, "env.settle_steps", self.settle_steps, "must be >= 0")


@dataclass(frozen=True)
class PolicyConfig:
    name: str = "tiny"
    """Policy family (rlvla3/policies): tiny (plain torch) | openvla (discrete action tokens from
    an LM: SigLIP + Qwen2/Llama at random init, or a released OpenVLA folder) | openvla_oft (a released
    OpenVLA-OFT folder: its L1 regression head as a Gaussian) | pi0 (transformers' PI0: flow-matching
    action expert) | pi05 (π0.5: LeRobot's layout, the state in the prompt) | smolvla (SmolVLA:
    LeRobot's layout, SmolVLM2 prefix and a cross-attending expert) | gr00t (GR00T N1.5: Eagle 2.5
    and a flow-matching DiT action head) | emulated (sleeps for the
    costs below; no torch)."""
    chunk: int = 1
    """Actions per forward (action chunking, OpenVLA-OFT/π0 style). The Simulator executes the
    first policy.execute_steps actions of a chunk, one env step each, and records one row per
    chunk: its reward is the sum over the steps executed, log-prob and advantage are per chunk (a
    chunk-level MDP)."""
    execute_steps: int = 0
    """Actions of each chunk the Simulator executes before the policy decides again (a receding
    horizon, as released π0/π0.5 checkpoints are evaluated: 10 of 50 on LIBERO). 0: what a
    released folder says (π0/π0.5: config.json's n_action_steps), else the whole chunk. The row
    keeps the whole chunk's sample and log-prob: the chunk is the decision sampled, of which the
    env saw the first steps."""
    decoding: str = "parallel"
    """openvla: parallel (all K*D action tokens from one forward, OpenVLA-OFT) | autoregressive
    (one token per forward with a KV cache, OpenVLA)."""
    lm: str = "qwen2"
    """openvla: the language model class (transformers): qwen2 | llama."""
    denoise_steps: int = 4
    """pi0, pi05, smolvla, gr00t: denoising steps per action chunk (each one a Gaussian transition, see flow_noise_std)."""
    flow_rl: str = "fixed"
    """the flow families (pi0, pi05, smolvla, gr00t): how each denoising step becomes a Gaussian with an exact
    log-probability (policies/flow_rl.py): fixed (the flow's step plus noise of a learned std per action dim) | noise
    (πRL's Flow-Noise: a network predicts each step's std) | sde (πRL's Flow-SDE: the ODE made the SDE with the
    same marginals, noise level policy.flow_sde_level)."""
    flow_sde_level: float = 0.5
    """flow_rl=sde: a in the SDE's sigma_tau = a * sqrt(tau / (1 - tau)) (tau: the noise fraction)."""
    flow_noise_std: float = 0.2
    """the flow families (pi0, pi05, smolvla, gr00t), flow_rl=fixed|noise: initial std of the noise injected at each denoising
    step (learned, kept in [0.01, 1]); it makes every step a Gaussian with a tractable log-probability.
    openvla_oft: the initial std of the Gaussian around the regressed chunk (normalised units)."""
    flow_start_std: float = 1.0
    """the flow families: std of the chain's start x_0 (1: the flow's own N(0, I)). log pi credits only the
    noise injected at the denoising steps, not x_0, so RL wants the randomness that decides an
    episode in the former: 0 starts every chain at the origin (a Gaussian policy around the flow's
    deterministic path), fractions in between shrink x_0's share."""
    lm_backend: str = "transformers"
    """openvla with lm=llama: the Trainer's language model, transformers | megatron (megatron-core
    GPTModel split over policy.tensor_parallel Trainer ranks; published weights are converted back
    to the transformers layout, so Generators are unchanged). megatron trains a random-initialised
    Llama only: with policy.pretrained it is refused before any rank starts."""
    tensor_parallel: int = 1
    """lm_backend=megatron: Trainer ranks per model replica (cluster.train_ranks must be a
    multiple; the replicas are data parallel)."""
    data_parallel: str = "replicate"
    """How Trainer ranks share the training (torch families, lm_backend=transformers): replicate
    (every rank holds the whole model and optimizer; one all-reduce of every gradient after
    backward) | fsdp (FSDP2: each rank holds 1/N of the parameters, gradients and Adam state,
    gathered layer by layer; gradients reduced during backward; what a 3-7 B model needs to
    fine-tune in full: python -m rlvla3.bench memory)."""
    compute_dtype: str = "float32"
    """data_parallel=fsdp: the Trainer's parameter and compute dtype, float32 | bfloat16 (the
    parameters are gathered in bf16 and the forward runs under autocast; gradients are reduced
    and Adam steps in float32 on float32 master weights)."""
    init_from: str = ""
    """A checkpoint (.pt: a run's ckpt/v*.pt or python -m rlvla3.sft's output) whose model weights
    the run starts from, e.g. an SFT warm start; empty: random init (or policy.pretrained)."""
    pretrained: str = ""
    """A local checkpoint folder to start from instead of random weights; nothing is downloaded.
    openvla: a released OpenVLA folder (openvla/openvla-7b or a fine-tune: its tokenizer, prompt,
    image transform and action statistics come with it); pi0: a transformers/LeRobot PI0 folder;
    pi05, smolvla: a LeRobot folder of that type; gr00t: a GR00T N1.5 folder."""
    tokenizer: str = ""
    """A local folder with the pretrained checkpoint's tokenizer.json when it is not in
    policy.pretrained (π0, π0.5: PaliGemma's tokenizer; SmolVLA: SmolVLM2's; GR00T: Eagle 2.5's;
    their folders ship none); empty: the checkpoint folder's own."""
    discrete_state_input: bool = True
    """pi05: write the state into the prompt as 256-bin text (openpi's discrete_state_input: π0.5
    reads its state nowhere else); false: the prompt is the task alone and the policy sees no
    state, as OpenVLA's. Other families read the proprio as a token and refuse false."""
    image_crop: float = 1.0
    """openvla/openvla_oft with pretrained: the fraction of each frame's area a centre crop keeps
    before the resize (fine-tunes trained on random crops); 1.0: no crop. On LIBERO the presets
    crop as the released evaluations do instead (env.image_pipeline=openvla), and leave this 1.0."""
    unnorm_key: str = ""
    """openvla with pretrained: the dataset in the folder's norm_stats whose action statistics
    un-normalise the actions (e.g. libero_spatial_no_noops); empty: the folder's only one."""
    lora_rank: int = 32
    """With policy.pretrained: > 0 trains rank-r LoRA adapters on every linear layer of the
    pretrained backbone (and the family's heads in full) instead of every weight: what fits a
    3-7 B Trainer on one 80 GB GPU; 0: full fine-tuning (with policy.data_parallel=fsdp over 2-4
    GPUs and more: python -m rlvla3.bench memory). A random-init model always trains in full."""
    lora_alpha: float = 16.0
    """LoRA's scale numerator: the update is (lora_alpha / lora_rank) * B A (OpenVLA: 16 at rank 32)."""
    lora_base_dtype: str = "bfloat16"
    """lora_rank > 0: the dtype the frozen base's linear weights are kept in, on Generators and
    Trainers alike: bfloat16 | float32."""
    grad_checkpointing: bool = True
    """With policy.pretrained: the Trainer recomputes each transformer layer's activations in the
    backward pass instead of keeping them (transformers' gradient checkpointing; layers that fill
    a KV cache, π0's and π0.5's Gemma layers, are not): activation memory per row drops to the
    layers' inputs, for about a third more compute. A random-init model keeps its activations."""
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

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        require(self.patch >= 1, "policy.patch", self.patch, "must be >= 1 (pixels per image patch)")
        require(self.chunk >= 1, "policy.chunk", self.chunk, "must be >= 1 (actions per forward)")
        require(0 <= self.execute_steps <= self.chunk, "policy.execute_steps", self.execute_steps,
                f"execute 1 to policy.chunk={self.chunk} actions of each chunk (0: the released folder's, else all)")
        require(self.decoding in ("parallel", "autoregressive"), "policy.decoding", self.decoding, "use parallel or autoregressive")
        require(self.lm in ("qwen2", "llama"), "policy.lm", self.lm, "use qwen2 or llama")
        require(self.denoise_steps >= 1, "policy.denoise_steps", self.denoise_steps, "must be >= 1")
        require(self.flow_rl in ("fixed", "noise", "sde"), "policy.flow_rl", self.flow_rl, "use fixed, noise or sde")
        require(self.flow_rl != "sde" or self.denoise_steps >= 2, "policy.denoise_steps", self.denoise_steps,
                "policy.flow_rl=sde needs at least 2 denoising steps (one step has no noise level to inject)")
        require(0.0 < self.flow_sde_level <= 2.0, "policy.flow_sde_level", self.flow_sde_level,
                "use a noise level in (0, 2] (πRL and Flow-GRPO use about 0.5-0.7)")
        require(self.lm_backend in ("transformers", "megatron"), "policy.lm_backend", self.lm_backend,
                "use transformers or megatron")
        require(self.data_parallel in ("replicate", "fsdp"), "policy.data_parallel", self.data_parallel,
                "use replicate or fsdp")
        require(self.compute_dtype in ("float32", "bfloat16"), "policy.compute_dtype", self.compute_dtype,
                "use float32 or bfloat16")
        require(self.compute_dtype == "float32" or self.data_parallel == "fsdp", "policy.compute_dtype",
                self.compute_dtype, "bfloat16 training needs policy.data_parallel=fsdp (its mixed-precision policy)")
        require(self.tensor_parallel >= 1, "policy.tensor_parallel", self.tensor_parallel, "must be >= 1")
        require(self.lora_rank >= 0, "policy.lora_rank", self.lora_rank, "must be >= 0 (0: full fine-tuning)")
        require(self.lora_alpha > 0, "policy.lora_alpha", self.lora_alpha, "must be > 0")
        require(self.lora_base_dtype in ("float32", "bfloat16"), "policy.lora_base_dtype", self.lora_base_dtype,
                "use bfloat16 or float32")
        require(0.1 <= self.image_crop <= 1.0, "policy.image_crop", self.image_crop,
                "keep a fraction in [0.1, 1] of the frame's area")
        require(0.01 <= self.flow_noise_std <= 1.0, "policy.flow_noise_std", self.flow_noise_std, "use a std in [0.01, 1]")
        require(0.0 <= self.flow_start_std <= 1.0, "policy.flow_start_std", self.flow_start_std,
                "use a std in [0, 1] (1: the flow's own start, 0: every chain starts at the origin)")
        for name in ("infer_fixed_ms", "infer_per_sample_ms", "weight_sync_ms"):
            require(getattr(self, name) >= 0, f"policy.{name}", getattr(self, name), "must be >= 0")
        require(self.train_samples_per_s > 0, "policy.train_samples_per_s", self.train_samples_per_s, "must be > 0")
        require(self.emulated_params >= 1, "policy.emulated_params", self.emulated_params, "must be >= 1")
        require(self.heads >= 1, "policy.heads", self.heads, "must be >= 1")
        require(self.d_model % self.heads == 0, "policy.d_model", self.d_model, f"must be divisible by policy.heads={self.heads}")
        require(self.vocab >= 3, "policy.vocab", self.vocab, "must be >= 3 (ids 0 and 1 are padding and end of text)")
        require(self.instruction_len >= 1, "policy.instruction_len", self.instruction_len, "must be >= 1")
        require(2 <= self.action_bins <= 65536, "policy.action_bins", self.action_bins, "use 2..65536 bins")
        require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None, "policy.device", self.device,
                "use auto, cpu, cuda or cuda:N")
        require(self.torch_threads >= 1, "policy.torch_threads", self.torch_threads, "must be >= 1")


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "ppo"
    """ppo: GAE advantages with a critic, decoupled PPO objective for stale samples |
    grpo: outcome (success 1/0) normalised within a group of episodes from one initial state, no critic |
    raft: RAFT++ (rejection sampling under the clipped ratio): advantage 1 for the decisions of successful
    episodes, 0 otherwise, no critic |
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
    ratio: str = "sequence"
    """sequence: one PPO ratio per sample (the product over its action tokens) | token: one ratio
    per action token, each clipped on its own, as LLM PPO/GRPO clip text tokens; for a continuous
    chunk (pi0, pi05, openvla_oft) one per action coordinate, over a chain its S denoising
    transitions (ppo or grpo; the Trainer recomputes pi_prox per token: one no-grad forward a row a
    version)."""
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

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        require(self.kl_coef >= 0, "algo.kl_coef", self.kl_coef, "must be >= 0")
        require(self.lr > 0, "algo.lr", self.lr, "must be > 0")
        require(self.clip > 0, "algo.clip", self.clip, "must be > 0")
        require(self.ratio in ("sequence", "token"), "algo.ratio", self.ratio, "use sequence or token")
        require(self.vtrace_rho_clip > 0 and self.vtrace_c_clip > 0, "algo.vtrace_rho_clip", self.vtrace_rho_clip,
                "V-trace clips must be > 0")
        require(self.segment_steps >= 1, "algo.segment_steps", self.segment_steps, "must be >= 1")
        require(self.update_epochs >= 1, "algo.update_epochs", self.update_epochs, "must be >= 1")
        require(self.max_versions >= 1, "algo.max_versions", self.max_versions, "must be >= 1")
        require(self.lr_warmup_steps >= 0, "algo.lr_warmup_steps", self.lr_warmup_steps, "must be >= 0 (0: no warm-up)")
        require(0 < self.gamma <= 1 and 0 <= self.gae_lambda <= 1, "algo.gamma", self.gamma, "gamma in (0,1], gae_lambda in [0,1]")
        require(self.behaviour_clip >= 1, "algo.behaviour_clip", self.behaviour_clip, "must be >= 1")


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

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        require(self.eta >= 0, "mode.eta", self.eta, "must be >= 0")
        require(self.overlap or not self.streaming, "mode.streaming", self.streaming,
                "streaming needs mode.overlap=true (micro-batches are trained as their shards arrive)")
        require(self.placement in ("disaggregated", "colocated"), "mode.placement", self.placement,
                "use disaggregated or colocated")


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
    weights_fanout: int = 2
    """A publish goes down a tree: Trainer 0 sends to this many Generators, each forwards every
    bucket to this many more as it lands (0: Trainer 0 sends to every Generator itself)."""
    adapt_batch: int = 0
    """Online batching window: 0 keeps t_max_ms fixed; N > 0 re-tunes the window 4x a second to
    the time N samples take to arrive at the observed rate (logged as scalar t_max_ms)."""
    greedy: bool = False
    """Act on the most likely action instead of sampling one (token argmax, a Gaussian's mean, a
    denoising chain without injected noise: policies/sampling.py greedy_noise), as the field
    evaluates OpenVLA. Evaluation only (python -m rlvla3.evaluate --greedy): RL learns from
    sampled actions and their log-probabilities."""

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        require(self.b_max >= 1, "generator.b_max", self.b_max, "must be >= 1")
        require(self.t_max_ms >= 0, "generator.t_max_ms", self.t_max_ms, "must be >= 0")
        require(self.weights_dtype in ("float32", "bfloat16"), "generator.weights_dtype", self.weights_dtype,
                "use float32 or bfloat16")
        require(self.weights_fanout >= 0, "generator.weights_fanout", self.weights_fanout,
                "must be >= 0 (0: Trainer 0 sends to every Generator; k: a k-ary relay tree)")
        require(self.weights_bucket_mb > 0, "generator.weights_bucket_mb", self.weights_bucket_mb, "must be > 0")


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
    # git-ignored conf/site/local.yaml (see docs/slurm.md).
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
    """Print what would run, and start nothing: the sbatch text of a Slurm job, or the local mpiexec command."""

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        for name in ("sim_ranks", "gen_ranks", "train_ranks"):
            require(getattr(self, name) >= 1, f"cluster.{name}", getattr(self, name), "must be >= 1")


# The choices of runtime's string fields, named once: RuntimeConfig.check checks them, the engine
# dispatches on them.
SHARD_CODECS = ("zstd", "none")
WAKES = ("doorbell", "sleep")
OBS_COMPRESSIONS = ("none", "lz4", "delta-lz4")


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
    keep_ckpts: int = 3
    """Keep the newest N checkpoints (a preemption checkpoint counts as one), plus ckpt/best.pt and
    any checkpoint an evaluation still reads; older ones are deleted once a newer one is on disk.
    0: keep every one."""
    ckpt_write_timeout: float = 1800.0
    """Seconds one checkpoint write may take (it runs beside training, on a thread of its own)
    before the Trainer fails the job, naming the file."""
    keep_shards: bool = True
    """Keep consumed shards (for replay and analysis) or delete them after their step."""
    shard_codec: str = "zstd"
    """zstd | none: how shard arrays are compressed. zstd (level 1) shrinks rendered frames ~5x for
    ~4x np.save's CPU on the Simulator's writer thread (`python -m rlvla3.bench shards`); none
    writes raw bytes, for a fast filesystem and a CPU-bound Simulator."""
    idle_sleep: float = 0.0005
    """Shortest sleep of a rank with nothing to do; doubles up to max_idle_sleep."""
    max_idle_sleep: float = 0.005
    """Longest idle sleep (bounds added latency)."""
    wake: str = "doorbell"
    """doorbell | sleep: how an idle rank learns a message has come. doorbell: every send also
    rings the receiver's UDP socket and an idle rank waits on it (and on its env children's
    pipes), waking within ~0.1 ms; sleep: it sleeps idle_sleep..max_idle_sleep between polls
    (`python -m rlvla3.bench latency` measures both). A lost ring costs at most max_idle_wait."""
    max_idle_wait: float = 0.05
    """runtime.wake=doorbell: the longest wait for a ring before looking anyway (what a lost ring
    costs at most); a rank some peer cannot ring (on another host whose name resolves to a
    loopback address) waits max_idle_sleep instead."""
    obs_compression: str = "none"
    """none | lz4 | delta-lz4: how a request's images travel from Simulator to Generator.
    delta-lz4 XORs each frame with the group's previous one before LZ4 (engine/obs_compression.py);
    worth it between nodes on a slow network, not on one node (`python -m rlvla3.bench obs`)."""
    spin_us: float = 0.0
    """For this many microseconds after it did work a rank polls without waiting (yielding the
    core), so an answer that comes soon finds it awake; 0: it waits at once."""
    expect_spin_us: float = 0.0
    """A rank polls without waiting around the moment it expects its next message (a Generator: a
    group's next request; a Simulator: a reply; learnt from the intervals seen, engine/doorbell.py:
    Cadence), at most this many microseconds either side, and sleeps on its doorbell otherwise;
    0: it never does. 500 saved a little of a hop in 6 of 8 pairs (`python -m rlvla3.bench
    latency`); off by default until it is shown not to change what timing-sensitive async runs
    learn (docs/results/engine-speed.md)."""
    tensorboard: bool = True
    """Trainer rank 0 writes TensorBoard scalars under tb/ (per version, and under by_env_steps/
    against the env steps so far) and the resolved config once."""
    wandb: bool = False
    """Trainer rank 0 logs the same scalars to Weights & Biases (the wandb package, under
    <run>/wandb/), with both x-axes (version, env_steps_total) and the resolved config once; a
    resumed run continues the same W&B run."""
    wandb_project: str = "rlvla3"
    """runtime.wandb: the W&B project."""
    wandb_entity: str = ""
    """runtime.wandb: the W&B entity (team or user); empty: the logged-in user's default."""
    wandb_name: str = ""
    """runtime.wandb: the W&B run name; empty: the run folder's name."""
    wandb_mode: str = "online"
    """runtime.wandb: online | offline (compute nodes without network: `wandb sync <run>/wandb/offline-run-*`
    later)."""
    progress: bool = True
    """Trainer rank 0 prints a progress line per version (a bar redrawn in place when the
    launcher's console is a terminal), with the ETA."""
    verbose: bool = False
    """Let third-party notices (robosuite's, megatron-core's, library warnings) through to the
    console; by default each process writes them to <run>/logs/<process>.log."""
    evaluate: bool = False
    """No optimizer steps: weights never change, and every segment is one whole episode of each
    env from its own seed (python -m rlvla3.evaluate sets it)."""
    eval_every: int = 0
    """Every N versions Trainer 0 evaluates that version's checkpoint while training goes on: a
    process of its own (`python -m rlvla3.evaluate --of-run <run> --checkpoint <ckpt>`) runs held-out episodes on
    evaluation envs of its own, logs success with its Wilson interval against the version, and
    keeps the best checkpoint by held-out success as ckpt/best.pt (0: never)."""
    eval_episodes: int = 16
    """runtime.eval_every: episodes per evaluation (rounded up to whole rounds of eval_envs)."""
    eval_envs: int = 2
    """runtime.eval_every: envs of the evaluation process (its env.num_envs)."""
    eval_seed: int = 1_000_003
    """runtime.eval_every: episode seeds derive from this, not from the training seed, so the
    evaluation's initial states are never the training ones; the same every version, so versions
    are compared on the same states."""
    eval_videos: int = 1
    """runtime.eval_every: mp4 of the first N episodes of each task per evaluation, logged
    against the version (0: none)."""
    eval_timeout: float = 1800.0
    """runtime.eval_every: seconds one evaluation may take before it is stopped (a failure)."""
    max_wall: float = 86400.0
    """Seconds the launcher waits for the whole job before killing it."""

    def check(self) -> None:
        """Each field on its own (checks across fields and sections: rlvla3/checks.py)."""
        for name in ("heartbeat_interval", "startup_timeout", "shutdown_timeout", "max_wall"):
            require(getattr(self, name) > 0, f"runtime.{name}", getattr(self, name), "must be > 0 (seconds)")
        require(self.wandb_mode in ("online", "offline"), "runtime.wandb_mode", self.wandb_mode, "use online or offline")
        require(self.ckpt_every >= 1, "runtime.ckpt_every", self.ckpt_every, "must be >= 1 (checkpoint every N versions)")
        require(self.keep_ckpts >= 0, "runtime.keep_ckpts", self.keep_ckpts, "must be >= 0 (0: keep every checkpoint)")
        require(self.ckpt_write_timeout > 0, "runtime.ckpt_write_timeout", self.ckpt_write_timeout, "must be > 0 (seconds)")
        for name, choices in (("shard_codec", SHARD_CODECS), ("wake", WAKES), ("obs_compression", OBS_COMPRESSIONS)):
            require(getattr(self, name) in choices, f"runtime.{name}", getattr(self, name), f"use one of {', '.join(choices)}")
        require(self.max_idle_wait > 0, "runtime.max_idle_wait", self.max_idle_wait, "use a positive number of seconds")
        require(self.spin_us >= 0, "runtime.spin_us", self.spin_us, "use 0 (wait at once) or more microseconds")
        require(self.expect_spin_us >= 0, "runtime.expect_spin_us", self.expect_spin_us, "use 0 (never) or more microseconds")
        require(self.liveness_timeout > 2 * self.heartbeat_interval, "runtime.liveness_timeout", self.liveness_timeout,
                "must exceed 2 * runtime.heartbeat_interval")
        require(self.eval_every >= 0, "runtime.eval_every", self.eval_every, "must be >= 0 (0: no evaluation while training)")
        for name in ("eval_episodes", "eval_envs"):
            require(getattr(self, name) >= 1, f"runtime.{name}", getattr(self, name), "must be >= 1")
        require(self.eval_videos >= 0, "runtime.eval_videos", self.eval_videos, "must be >= 0 (0: no videos)")
        require(self.eval_timeout > 0, "runtime.eval_timeout", self.eval_timeout, "must be > 0 (seconds)")


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


