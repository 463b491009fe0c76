"""Pure tensor maths of the RL algorithms, and the table of algorithms (ALGORITHMS, at the end);
no I/O, no state. Names follow the papers' symbols. numpy at import, torch only inside the loss
functions: every rank reads the table (world.py), and Simulator and emulated ranks never import torch.

- GAE: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
  Estimation", https://arxiv.org/abs/1506.02438
- PPO: Schulman et al. 2017, https://arxiv.org/abs/1707.06347
- Decoupled PPO (proximal anchor + clipped behaviour weight for stale samples): Hilton et al.
  2022, "Batch size-invariance for policy optimization", https://arxiv.org/abs/2110.00641, as
  used for asynchronous RL by AReaL (https://arxiv.org/abs/2505.24298).
- GRPO: Shao et al. 2024, "DeepSeekMath", https://arxiv.org/abs/2402.03300 (group-normalised
  outcome reward, no critic), as applied to VLAs by SimpleVLA-RL (https://arxiv.org/abs/2509.09674).
- V-trace: Espeholt et al. 2018, "IMPALA", https://arxiv.org/abs/1802.01561
- KL to a reference policy, k3 estimator: Schulman 2020, "Approximating KL divergence",
  http://joschu.net/blog/kl-approx.html
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import torch


def next_values(values: np.ndarray, bootstrap: np.ndarray, terminated: np.ndarray,
                truncated: np.ndarray) -> np.ndarray:
    """The value that follows each step t of a segment [T, N]:
      0          if the episode terminated at t,
      V(s_t)     if it was truncated at t (its final obs is never served; V(s_t) is the closest
                 estimate we have),
      bootstrap  at the segment's last step (V(s_T), stored with the segment),
      V(s_{t+1}) otherwise."""
    v_next = np.concatenate([values[1:], bootstrap[None]], 0)
    return np.where(truncated, values, v_next) * (1.0 - terminated.astype(np.float32))


def gae(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
        bootstrap: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns of one segment, arrays [T, N] (time-major), bootstrap [N].

    r_t, V(s_t) and the end flags are those of step t; V_next is `next_values`.
    delta_t = r_t + gamma * V_next - V(s_t);  A_t = delta_t + gamma * lam * (1 - end_t) * A_{t+1}.
    """
    T = rewards.shape[0]
    end = (terminated | truncated).astype(np.float32)
    delta = rewards + gamma * next_values(values, bootstrap, terminated, truncated) - values
    adv = np.zeros_like(values, dtype=np.float32)
    a = np.zeros(values.shape[1:], np.float32)
    for t in reversed(range(T)):
        a = delta[t] + gamma * lam * (1.0 - end[t]) * a
        adv[t] = a
    return adv, adv + values


def vtrace(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
           bootstrap: np.ndarray, log_rho: np.ndarray, gamma: float, rho_clip: float,
           c_clip: float) -> tuple[np.ndarray, np.ndarray]:
    """V-trace value targets v_s and policy-gradient advantages of one segment [T, N].

    log_rho = log pi(a|s) - log mu(a|s) (target over behaviour policy); rho_t = min(rho_clip,
    e^log_rho), c_t = min(c_clip, e^log_rho). With V_next as in `next_values`:
      delta_t = rho_t (r_t + gamma V_next - V(s_t))
      v_s - V(s_s) = delta_s + gamma c_s (1 - end_s) (v_{s+1} - V(s_{s+1}))
      A_s = rho_s (r_s + gamma v_next_s - V(s_s)),  v_next_s = v_{s+1}, or V_next at ends/the last step.
    """
    T = rewards.shape[0]
    ratio = np.exp(log_rho.astype(np.float64))
    rho = np.minimum(rho_clip, ratio).astype(np.float32)
    c = np.minimum(c_clip, ratio).astype(np.float32)
    end = (terminated | truncated).astype(np.float32)
    v_next = next_values(values, bootstrap, terminated, truncated)
    delta = rho * (rewards + gamma * v_next - values)
    vs_minus_v = np.zeros_like(values, dtype=np.float32)
    acc = np.zeros(values.shape[1:], np.float32)
    for t in reversed(range(T)):
        acc = delta[t] + gamma * c[t] * (1.0 - end[t]) * acc
        vs_minus_v[t] = acc
    vs = values + vs_minus_v
    # v_{s+1} where the episode continues inside the segment, else V_next as in the delta.
    vs_next = np.concatenate([vs[1:], bootstrap[None]], 0)
    vs_next = np.where(end.astype(bool), v_next, vs_next)
    vs_next[-1] = v_next[-1]
    return vs, rho * (rewards + gamma * vs_next - values)


def grpo_advantages(returns: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Outcome advantages of one group of episodes from the same initial state [N]:
    A_i = (R_i - mean(R)) / (std(R) + eps); all-equal outcomes give 0 (nothing to learn)."""
    r = returns.astype(np.float64)
    std = r.std()
    if std < eps:
        return np.zeros_like(returns, dtype=np.float32)
    return ((r - r.mean()) / (std + eps)).astype(np.float32)


def lr_at(lr: float, step: int, warmup: int, total: int, decay: bool) -> float:
    """Learning rate of optimizer step `step` (1-based) of `total`: a linear ramp over the first
    `warmup` steps (lr * step / warmup), then lr, or with `decay` a linear decay that reaches 0
    after step `total` (lr * (total - step + 1) / total: the last step still moves)."""
    scale = min(1.0, step / warmup) if warmup > 0 else 1.0
    if decay:
        scale *= max(0.0, (total - step + 1) / total)
    return lr * scale


def kl_k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-sample estimate of KL(pi || pi_ref) from log-probs of a sample: e^x - x - 1 with
    x = log pi_ref - log pi (unbiased for samples from pi, always >= 0, low variance)."""
    import torch

    x = logp_ref - logp
    return torch.exp(x) - x - 1.0


@dataclass(frozen=True)
class LossTerms:
    total: torch.Tensor        # summed over samples (divide by the global batch outside)
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor
    behaviour_weight: torch.Tensor
    approx_kl: torch.Tensor
    behaviour_weight_sq: torch.Tensor   # sum of w^2: with the sum of w, how evenly w spreads


def decoupled_ppo_loss(logp: torch.Tensor, logp_prox: torch.Tensor, logp_behav: torch.Tensor,
                       adv: torch.Tensor, value: torch.Tensor, ret: torch.Tensor, entropy: torch.Tensor,
                       clip: float, behaviour_clip: float, vf_coef: float, ent_coef: float,
                       weight: torch.Tensor | None = None, logp_ref: torch.Tensor | None = None,
                       kl_coef: float = 0.0) -> LossTerms:
    """Sum over samples of the decoupled PPO objective (each sample's terms times `weight`, 0 for
    rows that are not decisions, e.g. grpo padding).

    r = pi(a|s) / pi_prox(a|s)                 (trust region around the proximal policy)
    w = min(pi_prox(a|s) / pi_behav(a|s), c)   (off-policy correction, no gradient)
    L_pi = -w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)
    L = L_pi + vf_coef * 0.5 * (V - R)^2 - ent_coef * H + kl_coef * KL_k3(pi || pi_ref)
    With fresh samples pi_prox = pi_behav, so w = 1 and this is standard PPO.

    Token ratios (algo.ratio=token): `logp` and `logp_prox` are per action token [n, T] (a
    continuous chunk's: per action coordinate, T = K*D); each token gets its own ratio r_t,
    clipped on its own, and L_pi sums the tokens' surrogates (at
    r = 1 its gradient is the sequence ratio's: sum_t A grad log pi_t). A sample's ratio is the
    product of its T tokens' ratios, so with T = 56 a clip of 0.2 on the product stops a sample
    once its tokens moved ~0.3% each on average; per token, each stops only itself. w stays one
    weight per sample (the behaviour policy's log-prob is stored summed).
    """
    import torch

    m = torch.ones_like(logp_behav) if weight is None else weight
    per_token = logp.dim() == 2

    def per_sample(x: torch.Tensor) -> torch.Tensor:
        return x.sum(-1) if per_token else x

    # Padding rows (m = 0) hold log-probs of samples nobody drew (grpo: a segment padded after
    # its episodes ended): their ratios are set to 1 so that an exp overflow there cannot put
    # 0 * inf = NaN into the loss or the diagnostics.
    keep = m > 0
    keep_t = keep[:, None] if per_token else keep
    log_ratio = torch.where(keep_t, logp - logp_prox, 0.0)
    ratio = torch.exp(log_ratio)
    w = torch.exp(torch.where(keep, per_sample(logp_prox) - logp_behav, 0.0)).clamp(max=behaviour_clip).detach()
    adv_t = adv[:, None] if per_token else adv
    surr = per_sample(torch.minimum(ratio * adv_t, ratio.clamp(1 - clip, 1 + clip) * adv_t))
    l_pi = -(m * w * surr).sum()
    l_v = 0.5 * (m * (value - ret) ** 2).sum()
    h = (m * entropy).sum()
    total = l_pi + vf_coef * l_v - ent_coef * h
    if kl_coef > 0:
        total = total + kl_coef * (m * kl_k3(per_sample(logp), logp_ref)).sum()
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip).float()
        clip_frac = (m * (clipped.mean(-1) if per_token else clipped)).sum()   # per token: the share of tokens
        approx_kl = (m * per_sample(torch.expm1(log_ratio) - log_ratio)).sum()
    return LossTerms(total, l_pi.detach(), l_v.detach(), h.detach(), clip_frac, (m * w).sum(), approx_kl,
                     (m * w * w).sum())


# ---------------------------------------------------------------- the algorithms, each in one place
#
# Each algorithm is its advantages of one shard (segment), a few flags the engine asks instead of
# its name, and the config rules it adds to the shared batch arithmetic (checks.py raises them).


class SegmentError(ValueError):
    """A shard the algorithm cannot train (a GRPO group from several initial states)."""


def gae_segment(a: dict, attrs: dict, name: str, algo) -> tuple[np.ndarray, np.ndarray, dict]:
    """PPO: GAE advantages and returns from the critic's values."""
    adv, ret = gae(a["rewards"], a["values"], a["terminated"], a["truncated"], a["bootstrap"], algo.gamma,
                   algo.gae_lambda)
    return adv, ret, {}


def vtrace_segment(a: dict, attrs: dict, name: str, algo) -> tuple[np.ndarray, np.ndarray, dict]:
    """V-trace: targets depend on the version that trains the rows (π_prox), so they are computed
    then; the shard keeps what they need."""
    zeros = np.zeros_like(a["values"])
    return zeros, zeros, {k: a[k] for k in ("rewards", "values", "terminated", "truncated", "bootstrap")}


def episode_outcomes(a: dict) -> np.ndarray:
    """Each env's episode outcome [N] in an episodic shard: 1 if it succeeded on a valid row, else 0."""
    return (a["success"] & a["valid"]).any(0).astype(np.float32)


def grpo_segment(a: dict, attrs: dict, name: str, algo) -> tuple[np.ndarray, np.ndarray, dict]:
    """GRPO advantages [T, N] of one shard: its N episodes started from one state (checked by the
    digests of their first observations); each episode's outcome, 1 if it succeeded else 0 (the
    env's own success flag; dense shaping rewards are ignored: normalised within a group they
    would turn tiny return differences of failed episodes into full-size advantages), is
    normalised within the group and given to every decision of the episode, divided by the
    episode's length (relative to the group's mean). No critic."""
    digests = attrs.get("reset_digests") or []
    if len(set(digests)) != 1:
        raise SegmentError(f"grpo: shard {name} holds episodes from {len(set(digests))} different initial states "
                           f"(first-observation digests {digests} of envs {attrs.get('env_ids')}): the env's reset "
                           f"is not a function of its seed, or the shard was not written in episodic mode")
    outcome = episode_outcomes(a)
    # GRPO's 1/|o_i|: each episode weighs the same whatever its length. Summed over rows instead,
    # failures (which run to the horizon) outweigh the shorter successes of their group, so the
    # net update pushes sampled actions down and entropy up (seen on Lift). Scaled by the mean
    # length, a row keeps weight 1 on average and a group's advantages sum to 0 over its rows.
    rows = a["valid"].sum(0).astype(np.float64)
    per_row = grpo_advantages(outcome) * rows.mean() / np.maximum(rows, 1)
    adv = np.broadcast_to(per_row, a["rewards"].shape) * a["valid"]
    return adv.astype(np.float32), np.zeros_like(adv, dtype=np.float32), {}


def raft_segment(a: dict, attrs: dict, name: str, algo) -> tuple[np.ndarray, np.ndarray, dict]:
    """RAFT++ advantages [T, N] of one shard: 1 for every decision of an episode that succeeded
    (the env's own success flag), 0 for failed episodes and padding. Under the clipped ratio this
    is behaviour cloning of the policy's own successes: the failures' samples are not pushed down
    (GRPO's negative advantages spread the probability a 256-bin token loses over all the other
    bins). No groups: each env resets from its own seed. No critic."""
    adv = np.broadcast_to(episode_outcomes(a), a["rewards"].shape) * a["valid"]
    return adv.astype(np.float32), np.zeros_like(adv, dtype=np.float32), {}


Broken = tuple[str, Any, str]   # (field, value, how to fix it)


def no_critic(cfg) -> Broken | None:
    a = cfg.algo
    if a.vf_coef != 0:
        return ("algo.vf_coef", a.vf_coef, f"{a.name} has no critic: set algo.vf_coef=0 (conf/algo/{a.name}.yaml does)")
    return None


def sequence_ratio(cfg) -> Broken | None:
    if cfg.algo.ratio == "token":
        return ("algo.ratio", "token", "algo.name=vtrace weighs whole samples in its targets: use algo.ratio=sequence, "
                "or ppo/grpo")
    return None


def groups_of_two(plan: list[list[int]]) -> Broken | None:
    if min(map(min, plan)) < 2:
        return ("sharding.plan", plan, "grpo compares the episodes of one env group (same initial state): every group "
                "needs >= 2 envs")
    return None


@dataclass(frozen=True)
class Algorithm:
    name: str
    segment: Callable[..., tuple[np.ndarray, np.ndarray, dict]]
    """(shard arrays, attrs, shard name, cfg.algo) -> advantages, returns, what targets need later."""
    episodic: bool = False
    """Whole episodes a segment, each env reset at a segment's start (outcome algorithms; checks.algo
    refuses a segment shorter than an episode)."""
    shared_reset: bool = False
    """A group's envs reset from one seed: a group is one initial state."""
    targets_per_version: bool = False
    """Advantages from π_prox of the version that trains the rows (V-trace), not at load."""
    rules: tuple[Callable[[Any], Broken | None], ...] = field(default=())
    """Config rules beyond the shared batch arithmetic (checks.algo)."""
    group_rules: tuple[Callable[[list[list[int]]], Broken | None], ...] = field(default=())
    """Rules on the sharding plan's groups (checks.sharding)."""


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("ppo", gae_segment),
    Algorithm("grpo", grpo_segment, episodic=True, shared_reset=True, rules=(no_critic,),
              group_rules=(groups_of_two,)),
    Algorithm("raft", raft_segment, episodic=True, rules=(no_critic,)),
    Algorithm("vtrace", vtrace_segment, targets_per_version=True, rules=(sequence_ratio,)),
)}
