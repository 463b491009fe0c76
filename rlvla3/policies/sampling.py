"""What a policy family samples per observation (the layout a shard keeps to recompute log pi)
and the token-to-action map of the discrete families. numpy only: Simulators, the wire codecs
and emulated ranks read it without torch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .registry import family_names

# Families whose action is a flow-matching denoising chain, families that draw one Gaussian
# action chunk around a regressed mean; every other family samples tokens (registry.FAMILIES).
CHAIN_FAMILIES = family_names(lambda f: f.samples == "chain")
GAUSSIAN_FAMILIES = family_names(lambda f: f.samples == "gaussian")


@dataclass(frozen=True)
class SampleLayout:
    """What one forward samples per observation, i.e. what a shard must keep for the Trainer to
    recompute log pi(sample | obs) (shards.py documents the arrays):
    - token families (tiny, openvla, emulated): action token ids int32 [K*D] (chunk-major), drawn
      by Gumbel-max from uniform noise [K*D, bins];
    - chain families (pi0, pi05): the denoising chain float32 [S+1, K, D] (x_0 = initial noise, x_S =
      the executed chunk), drawn from standard-normal noise of the same shape;
    - Gaussian families (openvla_oft): the chunk float32 [K, D] in the checkpoint's normalised
      action space, mean + sigma * standard-normal noise of the same shape.
    A Generator draws the noise per request (seeded), so a sample never depends on its batch."""

    kind: str             # tokens | chain | gaussian
    chunk: int
    action_dim: int
    shape: tuple[int, ...]
    dtype: str
    noise_shape: tuple[int, ...]
    noise: str            # uniform | normal


def sample_layout(pcfg, action_dim: int) -> SampleLayout:
    k = pcfg.chunk
    if pcfg.name in CHAIN_FAMILIES:
        shape = (pcfg.denoise_steps + 1, k, action_dim)
        return SampleLayout("chain", k, action_dim, shape, "float32", shape, "normal")
    if pcfg.name in GAUSSIAN_FAMILIES:
        return SampleLayout("gaussian", k, action_dim, (k, action_dim), "float32", (k, action_dim), "normal")
    return SampleLayout("tokens", k, action_dim, (k * action_dim,), "int32", (k * action_dim, pcfg.action_bins), "uniform")


def draw_noise(layout: SampleLayout, rng: np.random.Generator, n: int) -> np.ndarray:
    """The sampling noise [n, *layout.noise_shape] float32 for n observations: U(0, 1) for
    Gumbel-max over tokens, N(0, 1) for a denoising chain or a Gaussian chunk."""
    shape = (n, *layout.noise_shape)
    if layout.noise == "normal":
        return rng.standard_normal(shape, dtype=np.float32)
    return rng.random(shape, dtype=np.float32)


def greedy_noise(layout: SampleLayout, noise: np.ndarray) -> np.ndarray:
    """The noise [n, *layout.noise_shape] that makes a family act on its most likely action
    instead of sampling one (generator.greedy, evaluation only), given the drawn noise:
    - tokens: U = e^-1 everywhere, so every Gumbel is -log(-log U) = 0 and Gumbel-max is the
      argmax of the logits (OpenVLA's own decoding);
    - gaussian: zero, the regressed mean chunk (OpenVLA-OFT's L1 head acts on it);
    - chain: the drawn start x_0 and no noise injected at later steps, the deterministic flow
      π0 and π0.5 run at inference."""
    if layout.kind == "tokens":
        return np.full_like(noise, np.exp(-1.0))
    if layout.kind == "gaussian":
        return np.zeros_like(noise)
    out = np.zeros_like(noise)
    out[:, 0] = noise[:, 0]
    return out


def tokens_to_actions(tokens: np.ndarray, bins: int, chunk: int, action_dim: int) -> np.ndarray:
    """Action token ids [n, K*D] -> env action chunks [n, K, D]: bin b -> 2b/(bins-1) - 1."""
    return (tokens.astype(np.float32) / (bins - 1) * 2.0 - 1.0).reshape(-1, chunk, action_dim)


def expert_sample(layout, actions: np.ndarray, bins: int) -> np.ndarray:
    """Expert action chunks [n, K, D] in [-1, 1] as a sample of `layout` with no checkpoint's own
    normalisation (a released checkpoint's family maps them with its statistics:
    `Policy.expert_sample`): token ids the nearest of `bins` centres, a Gaussian's mean the
    actions, a chain ending at them."""
    n = actions.shape[0]
    if layout.kind == "tokens":   # token ids: the nearest of `bins` centres in [-1, 1]
        return np.rint((np.clip(actions, -1, 1) + 1) / 2 * (bins - 1)).astype(np.int32).reshape(n, *layout.shape)
    if layout.kind == "gaussian":
        return actions.reshape(n, *layout.shape).astype(np.float32)
    chain = np.zeros((n, *layout.shape), np.float32)
    chain[:, -1] = actions.reshape(n, *layout.shape[1:])
    return chain
