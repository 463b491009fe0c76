"""policy.flow_rl: the flow families' denoising chain as a policy three ways (policies/flow_rl.py).
Flow-SDE keeps the flow's marginals (checked on a Gaussian whose velocity is exact); in every
mode and family act's log-prob is evaluate's, Flow-Noise's network gets gradients, a greedy
chain is the deterministic flow; Flow-Noise trains through the engine with the Generator's and
Trainer's log-probs equal."""
from __future__ import annotations

import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError
from rlvla3.policies import flow_rl, make_policy
from rlvla3.policies.prompts import instruction_encoder
from rlvla3.policies.sampling import greedy_noise
from rlvla3.world import spec, validate
from tests.conftest import LOGP_CHECK, TOY, final_checkpoint, needs_mpi, obs_batch, run_logprob_check

FLOW_TOYS = {
    "pi0": ["policy=pi0", "policy.patch=3", "policy.chunk=2", "policy.denoise_steps=3"],
    "pi05": ["policy=pi05", "policy.patch=3", "policy.chunk=2", "policy.denoise_steps=3", "policy.instruction_len=48"],
    "smolvla": ["policy=smolvla", "policy.d_model=128", "policy.heads=2", "policy.patch=3", "policy.chunk=3",
                "policy.denoise_steps=3", "policy.instruction_len=16"],
    "gr00t": ["policy=gr00t", "policy.d_model=72", "policy.heads=1", "policy.layers=1", "policy.patch=7",
              "policy.chunk=3", "policy.denoise_steps=3", "policy.instruction_len=24"],
}


def gaussian_velocity(m: float, s: float):
    """The exact u = E[eps - a | x_tau] for actions a ~ N(m, s^2) (both Gaussian: linear in x)."""
    def u(x, tau):
        var = tau ** 2 + (1 - tau) ** 2 * s ** 2
        return -m + (tau - (1 - tau) * s ** 2) / var * (x - (1 - tau) * m)
    return u


@pytest.mark.parametrize("level", [0.5, 1.0])
def test_flow_sde_ends_where_the_flow_does(level):
    """Started from N(0, 1), the SDE's chain ends distributed as the actions (N(0.7, 0.3^2)), as
    the ODE's does; without its score term (noise alone) it would end with std ~0.6."""
    torch.manual_seed(0)
    m, s, steps = 0.7, 0.3, 100
    u = gaussian_velocity(m, s)
    x = torch.randn(100_000, 1, 1)
    for k in range(steps):
        mean, std = flow_rl.transition("sde", x, u(x, flow_rl.noise_level(k, steps)), k, steps, sde_level=level)
        assert float(std.min()) > 0
        x = mean + std * torch.randn_like(x)
    assert abs(float(x.mean()) - m) < 0.01 and abs(float(x.std()) - s) < 0.01, (float(x.mean()), float(x.std()))


def build(family: str, mode: str, *extra: str):
    cfg = compose([*TOY, *FLOW_TOYS[family], f"policy.flow_rl={mode}", *extra])
    validate(cfg)
    sp = spec(cfg)
    return make_policy(cfg, sp), sp, cfg


@pytest.mark.parametrize("family", list(FLOW_TOYS))
@pytest.mark.parametrize("mode", ["noise", "sde"])
def test_act_and_evaluate_agree_and_a_greedy_chain_is_the_flow(family, mode):
    policy, sp, cfg = build(family, mode)
    images, proprio, tokens, noise = obs_batch(sp, instruction_encoder(cfg.policy))
    sample, logp, value = policy.act(images, proprio, tokens, noise)
    lp, entropy, v = policy.evaluate(images, proprio, tokens, sample)
    torch.testing.assert_close(lp, logp, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(v, value, atol=1e-5, rtol=1e-5)
    assert entropy.shape == (3,) and torch.isfinite(entropy).all()
    if mode == "noise":   # the noise network trains with the policy (its output layer first: it starts at zero)
        (lp.sum() - entropy.sum()).backward()
        out = policy.noise_head.net[-1]
        assert out.weight.grad.abs().sum() > 0 and out.bias.grad.abs().sum() > 0
    # Greedy (evaluation): no injected noise, the deterministic flow, as `fixed` (same weights) runs it.
    greedy = torch.from_numpy(greedy_noise(sp.sample, noise.numpy()))
    fixed, _, _ = build(family, "fixed")
    torch.testing.assert_close(policy.act(images, proprio, tokens, greedy)[0], fixed.act(images, proprio, tokens, greedy)[0])


def test_flow_rl_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigError, match=r"policy\.flow_rl.*does not sample a denoising chain"):
        validate(compose([*TOY, "policy.flow_rl=noise"]))
    with pytest.raises(ConfigError, match=r"policy\.denoise_steps.*at least 2 denoising steps"):
        validate(compose([*TOY, *FLOW_TOYS["pi05"], "policy.flow_rl=sde", "policy.denoise_steps=1"]))
    with pytest.raises(ConfigError, match=r"policy\.flow_rl.*use fixed, noise or sde"):
        validate(compose([*TOY, *FLOW_TOYS["pi05"], "policy.flow_rl=ode"]))


@needs_mpi
@pytest.mark.slow
def test_flow_noise_trains_through_the_engine_with_equal_logprobs(tmp_path):
    run = run_logprob_check(tmp_path, [*TOY, *LOGP_CHECK, *FLOW_TOYS["pi05"], "policy.flow_rl=noise"], "pi05 flow-noise")
    model = final_checkpoint(run)["model"]
    assert model["noise_head.net.2.weight"].abs().sum() > 0, "the noise network's output layer never moved from zero"
