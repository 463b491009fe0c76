"""Pure tensor maths of the RL algorithms; no I/O, no state. Names follow the papers' symbols.

- GAE: Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
  Estimation", https://arxiv.org/abs/1506.02438
- PPO: Schulman et al. 2017, https://arxiv.org/abs/1707.06347
- Decoupled PPO (proximal anchor + clipped behaviour weight for stale samples): Hilton et al.
  2022, "Batch size-invariance for policy optimization", https://arxiv.org/abs/2110.00641, as
  used for asynchronous RL by AReaL (https://arxiv.org/abs/2505.24298).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def gae(rewards: np.ndarray, values: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
        bootstrap: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns of one segment, arrays [T, N] (time-major), bootstrap [N].

    r_t, V(s_t) and the end flags are those of step t. The value that follows step t is
      0          if the episode terminated at t,
      V(s_t)     if it was truncated at t (its final obs is never served; V(s_t) is the closest
                 estimate we have),
      bootstrap  at the segment's last step (V(s_T), stored with the segment),
      V(s_{t+1}) otherwise.
    delta_t = r_t + gamma * V_next - V(s_t);  A_t = delta_t + gamma * lam * (1 - end_t) * A_{t+1}.
    """
    T = rewards.shape[0]
    term = terminated.astype(np.float32)
    end = np.maximum(term, truncated.astype(np.float32))
    v_next = np.concatenate([values[1:], bootstrap[None]], 0)
    v_next = np.where(truncated, values, v_next) * (1.0 - term)
    delta = rewards + gamma * v_next - values
    adv = np.zeros_like(values, dtype=np.float32)
    a = np.zeros(values.shape[1:], np.float32)
    for t in reversed(range(T)):
        a = delta[t] + gamma * lam * (1.0 - end[t]) * a
        adv[t] = a
    return adv, adv + values


@dataclass(frozen=True)
class LossTerms:
    total: torch.Tensor        # summed over samples (divide by the global batch outside)
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor
    behaviour_weight: torch.Tensor
    approx_kl: torch.Tensor


def decoupled_ppo_loss(logp: torch.Tensor, logp_prox: torch.Tensor, logp_behav: torch.Tensor,
                       adv: torch.Tensor, value: torch.Tensor, ret: torch.Tensor, entropy: torch.Tensor,
                       clip: float, behaviour_clip: float, vf_coef: float, ent_coef: float) -> LossTerms:
    """Sum over samples of the decoupled PPO objective.

    r = pi(a|s) / pi_prox(a|s)                 (trust region around the proximal policy)
    w = min(pi_prox(a|s) / pi_behav(a|s), c)   (off-policy correction, no gradient)
    L_pi = -w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)
    L = L_pi + vf_coef * 0.5 * (V - R)^2 - ent_coef * H
    With fresh samples pi_prox = pi_behav, so w = 1 and this is standard PPO.
    """
    ratio = torch.exp(logp - logp_prox)
    w = torch.exp(logp_prox - logp_behav).clamp(max=behaviour_clip).detach()
    surr = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    l_pi = -(w * surr).sum()
    l_v = 0.5 * ((value - ret) ** 2).sum()
    h = entropy.sum()
    with torch.no_grad():
        clip_frac = ((ratio - 1).abs() > clip).float().sum()
        approx_kl = ((ratio - 1) - torch.log(ratio)).sum()
    return LossTerms(l_pi + vf_coef * l_v - ent_coef * h, l_pi.detach(), l_v.detach(), h.detach(),
                     clip_frac, w.sum(), approx_kl)
