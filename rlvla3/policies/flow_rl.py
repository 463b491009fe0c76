"""How a flow family's denoising chain becomes a stochastic policy with an exact log-probability
(policy.flow_rl). Three ways, each making every denoising step k a Gaussian transition

    x_{k+1} ~ N(mean_k, std_k^2),   log pi(chain | obs) = sum_k log N(x_{k+1}; mean_k, std_k^2)

(x_0 is drawn independently of the weights and left out). The families differ in their time
convention, so this module works in one of its own: tau, the noise fraction of the interpolant
x_tau = tau * eps + (1 - tau) * a (tau = 1 pure noise, tau = 0 the action), stepped from tau_0 = 1
to tau_S = 0 in S equal steps, and u = dx/dtau = eps - a, the velocity a family predicts (π0,
π0.5, SmolVLA predict u itself; GR00T predicts -u in its own time t = 1 - tau). The deterministic
flow is then x_{k+1} = x_k - u / S.

- `fixed`: the flow's Euler step plus noise of a learned std per action dim, independent of the
  state (ReinFlow, Zhang et al. 2025, arXiv 2505.22094, with its noise network reduced to one
  vector): mean_k = x_k - u_k / S, std_k = sigma.
- `noise`: πRL's Flow-Noise (Chen et al. 2025, "πRL: Online RL Fine-tuning for Flow-based
  Vision-Language-Action Models", arXiv 2510.25889, Sec. 4.1): the same mean, and a noise network
  that predicts the std of each step and coordinate, trained with the policy (the chain's
  likelihood stays exact because the std is a function of what the step conditions on). The
  network here reads the step's input x_k, the velocity u_k the model predicts for it (its
  answer to the observation) and tau_k; it starts as `fixed` at policy.flow_noise_std.
- `sde`: πRL's Flow-SDE (Sec. 4.2): the probability-flow ODE replaced by the reverse-time SDE
  with the same marginals, dx = [u + sigma_tau^2 / (2 tau) * eps_hat] dtau + sigma_tau dW, where
  eps_hat = x + (1 - tau) u is the noise the model's velocity implies (-eps_hat / tau is the
  score of the interpolant's marginal) and sigma_tau = a * sqrt(tau / (1 - tau)) (a:
  policy.flow_sde_level), stepped by Euler-Maruyama with dtau = -1/S:
      mean_k = x_k - (u_k + sigma^2 / (2 tau_k) * eps_hat_k) / S,   std_k = sigma * sqrt(1 / S).
  sigma_tau diverges at tau = 1: the first step takes the next grid point's (tau = 1 - 1/S), the
  usual choice for the first step of a flow SDE sampler.

A chain drawn with no injected noise (generator.greedy, evaluation) is the deterministic flow in
every mode: the means of `fixed` and `noise` are its Euler steps, and `sde` drops its score term
for such a chain (sigma = 0 is the ODE), as πRL deploys its policies.
"""
from __future__ import annotations

import math

import torch
from torch import nn

MODES = ("fixed", "noise", "sde")
LOG_STD_RANGE = (math.log(0.01), 0.0)   # every learned std of a flow step stays in [0.01, 1]
TIME_FREQS = 4                          # sin/cos features of tau the noise network reads


def noise_level(k: int, steps: int) -> float:
    """tau_k: the noise fraction of the chain's k-th state (1 at the start, 0 at the action)."""
    return 1.0 - k / steps


class NoiseHead(nn.Module):
    """Flow-Noise's network: log std [n, K, D] of one denoising step from the step's input x,
    the predicted velocity u (both [n, K, D]) and tau, bounded to LOG_STD_RANGE. Its output layer
    starts at zero with a bias at `initial_std`, so training starts from `fixed`."""

    def __init__(self, action_dim: int, initial_std: float, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * action_dim + 2 * TIME_FREQS, hidden), nn.SiLU(), nn.Linear(hidden, action_dim))
        lo, hi = LOG_STD_RANGE
        frac = (math.log(initial_std) - lo) / (hi - lo)
        frac = min(max(frac, 1e-3), 1 - 1e-3)
        nn.init.zeros_(self.net[-1].weight)
        nn.init.constant_(self.net[-1].bias, math.log(frac / (1 - frac)))

    def forward(self, x: torch.Tensor, u: torch.Tensor, tau: float) -> torch.Tensor:
        freqs = torch.arange(1, TIME_FREQS + 1, device=x.device, dtype=torch.float32) * math.pi * tau
        time = torch.cat([freqs.sin(), freqs.cos()]).expand(*x.shape[:-1], 2 * TIME_FREQS)
        z = self.net(torch.cat([x.float(), u.float(), time], -1))
        lo, hi = LOG_STD_RANGE
        return lo + (hi - lo) * torch.sigmoid(z)


def sde_sigma(k: int, steps: int, level: float) -> float:
    """sigma_tau of Flow-SDE at step k (the next grid point's at tau = 1, where it diverges)."""
    tau = min(noise_level(k, steps), 1.0 - 1.0 / steps)
    return level * math.sqrt(tau / (1.0 - tau))


def transition(mode: str, x: torch.Tensor, u: torch.Tensor, k: int, steps: int, *, sigma: torch.Tensor | None = None,
               noise_head: NoiseHead | None = None, sde_level: float = 0.0,
               stochastic: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) of x_{k+1} given x_k and the velocity u_k (all [n, K, D]); std broadcasts to
    the mean. `sigma` ([D]) is `fixed`'s std, `noise_head` Flow-Noise's network; `stochastic`
    ([n] bool, sde only): False for a chain drawn without injected noise, which runs the ODE."""
    ode = x - u / steps
    if mode == "fixed":
        return ode, sigma
    if mode == "noise":
        return ode, noise_head(x, u, noise_level(k, steps)).exp()
    if mode != "sde":
        raise ValueError(f"policy.flow_rl={mode!r}: use one of {MODES}")
    s = sde_sigma(k, steps, sde_level)
    tau = noise_level(k, steps)
    eps_hat = x + (1.0 - tau) * u
    score_term = (s * s / (2.0 * tau)) * eps_hat / steps
    if stochastic is not None:
        score_term = score_term * stochastic.to(score_term.dtype).view(-1, *([1] * (x.dim() - 1)))
    return ode - score_term, torch.full_like(x, s * math.sqrt(1.0 / steps))


def gaussian_logp(mean: torch.Tensor, std: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std^2) per coordinate."""
    return torch.distributions.Normal(mean, std).log_prob(x)


def gaussian_entropy(std: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The entropy of a step's Gaussian per sample [n] (std broadcast to `like`, [n, K, D])."""
    return (0.5 * math.log(2 * math.pi * math.e) + torch.broadcast_to(std.log(), like.shape)).sum((-1, -2))
