"""The policy interface the Generator and Trainer use.

A policy maps a batch of observations (images uint8 [n, cams, H, W, 3], proprio float32 [n, P],
instruction tokens int32 [n, L]) to a distribution over discrete action tokens
(int [n, A] with `action_bins` values per dimension) and a value estimate V(s).
- `act` samples tokens with given uniform noise (Gumbel-max), so a sample depends only on its
  own noise, never on which other samples share the batch;
- `evaluate` returns log pi(a|s), entropy and V(s) with gradients, for the Trainer;
- `to_env_action` maps tokens to the env's continuous action.
Later families (action chunks, flow-matching heads) extend this interface.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn


class Policy(nn.Module):
    action_bins: int

    def logits_and_value(self, images, proprio, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def act(self, images, proprio, tokens, uniform_noise: torch.Tensor):
        """Sample action tokens by Gumbel-max with the given U(0,1) noise [n, A, bins]."""
        logits, value = self.logits_and_value(images, proprio, tokens)
        logp_all = torch.log_softmax(logits.float(), -1)
        gumbel = -torch.log(-torch.log(uniform_noise.clamp(1e-10, 1 - 1e-7)))
        tok = torch.argmax(logp_all + gumbel, -1)
        logp = logp_all.gather(-1, tok[..., None])[..., 0].sum(-1)
        return tok, logp, value.float()

    def evaluate(self, images, proprio, tokens, action_tokens):
        """log pi(a|s) [n] (summed over action dims), entropy [n], V(s) [n]."""
        logits, value = self.logits_and_value(images, proprio, tokens)
        logp_all = torch.log_softmax(logits.float(), -1)
        logp = logp_all.gather(-1, action_tokens.long()[..., None])[..., 0].sum(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1).sum(-1)
        return logp, entropy, value.float()

    def to_env_action(self, action_tokens: np.ndarray) -> np.ndarray:
        """Token ids -> bin centres in [-1, 1]."""
        return (action_tokens.astype(np.float32) / (self.action_bins - 1)) * 2.0 - 1.0


def flat_params(model: nn.Module) -> np.ndarray:
    """All parameters as one contiguous float32 numpy buffer (what travels to Generators)."""
    return torch.nn.utils.parameters_to_vector([p.detach().float().cpu() for p in model.parameters()]).numpy()


def load_flat_params(model: nn.Module, flat: np.ndarray) -> None:
    n = sum(p.numel() for p in model.parameters())
    if flat.size != n:
        raise ValueError(f"weights buffer has {flat.size} values, the model has {n} parameters")
    vec = torch.from_numpy(flat)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(vec.to(next(model.parameters()).device), list(model.parameters()))


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"policy.device={setting} but this rank sees no CUDA device "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__}); "
                           "use policy.device=auto or cpu")
    return torch.device(setting)


class TorchActor:
    """The Generator's side of a torch policy: numpy in, numpy out, weights as one flat buffer."""

    def __init__(self, policy: Policy, device_setting: str):
        self.device = pick_device(device_setting)
        self.policy = policy.to(self.device).eval()
        self.n_params = sum(p.numel() for p in self.policy.parameters())

    def load(self, flat: np.ndarray) -> None:
        load_flat_params(self.policy, flat)

    def act(self, obs: dict[str, np.ndarray], noise: np.ndarray):
        """(action tokens, log-prob, value) as numpy for a batch of observations."""
        t = {k: torch.from_numpy(v).to(self.device) for k, v in obs.items()}
        tok, logp, value = self.policy.act(t["images"], t["proprio"], t["tokens"], torch.from_numpy(noise).to(self.device))
        return tok.cpu().numpy(), logp.cpu().numpy(), value.cpu().numpy()

    def to_env_action(self, action_tokens: np.ndarray) -> np.ndarray:
        return self.policy.to_env_action(action_tokens)
