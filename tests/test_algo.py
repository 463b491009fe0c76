"""GAE and the decoupled PPO loss against slow, obviously-correct reference loops."""
import math

import numpy as np
import torch

from rlvla3.algo import decoupled_ppo_loss, gae


def gae_reference(r, v, term, trunc, boot, gamma, lam):
    T, N = r.shape
    adv = np.zeros((T, N))
    for n in range(N):
        a = 0.0
        for t in reversed(range(T)):
            if term[t, n]:
                v_next, cont = 0.0, 0.0
            elif trunc[t, n]:
                v_next, cont = v[t, n], 0.0
            else:
                v_next = boot[n] if t == T - 1 else v[t + 1, n]
                cont = 1.0
            delta = r[t, n] + gamma * v_next - v[t, n]
            a = delta + gamma * lam * cont * a
            adv[t, n] = a
    return adv, adv + v


def test_gae_matches_reference_loop():
    rng = np.random.default_rng(0)
    T, N = 23, 5
    r = rng.normal(size=(T, N)).astype(np.float32)
    v = rng.normal(size=(T, N)).astype(np.float32)
    term = rng.random((T, N)) < 0.1
    trunc = (rng.random((T, N)) < 0.1) & ~term
    boot = rng.normal(size=N).astype(np.float32)
    adv, ret = gae(r, v, term, trunc, boot, 0.97, 0.9)
    ref_adv, ref_ret = gae_reference(r, v, term, trunc, boot, 0.97, 0.9)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_lambda_one_no_ends_is_discounted_return_minus_value():
    r = np.ones((4, 1), np.float32)
    v = np.zeros((4, 1), np.float32)
    f = np.zeros((4, 1), bool)
    adv, _ = gae(r, v, f, f, np.array([10.0], np.float32), 0.5, 1.0)
    assert np.isclose(adv[0, 0], 1 + 0.5 + 0.25 + 0.125 + 0.0625 * 10)


def test_decoupled_ppo_loss_matches_per_sample_loop():
    g = torch.Generator().manual_seed(0)
    n = 64
    logp = torch.randn(n, generator=g) * 0.3 - 1
    logp_prox = logp + torch.randn(n, generator=g) * 0.3
    logp_behav = logp_prox + torch.randn(n, generator=g) * 0.5
    adv, value, ret, ent = (torch.randn(n, generator=g) for _ in range(4))
    clip, c, vf, ef = 0.2, 2.0, 0.5, 0.01
    terms = decoupled_ppo_loss(logp, logp_prox, logp_behav, adv, value, ret, ent, clip, c, vf, ef)
    total = 0.0
    for i in range(n):
        ratio = math.exp(float(logp[i] - logp_prox[i]))
        w = min(math.exp(float(logp_prox[i] - logp_behav[i])), c)
        surr = min(ratio * float(adv[i]), min(max(ratio, 1 - clip), 1 + clip) * float(adv[i]))
        total += -w * surr + vf * 0.5 * float(value[i] - ret[i]) ** 2 - ef * float(ent[i])
    assert np.isclose(float(terms.total), total, rtol=1e-5)


def test_fresh_samples_reduce_to_ppo():
    """pi_prox == pi_behav gives weight 1: the standard clipped PPO objective."""
    logp = torch.tensor([-1.0, -2.0])
    old = torch.tensor([-1.5, -1.5])
    adv = torch.tensor([1.0, -1.0])
    z = torch.zeros(2)
    t = decoupled_ppo_loss(logp, old, old, adv, z, z, z, 0.2, 2.0, 0.0, 0.0)
    ratio = torch.exp(logp - old)
    ppo = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).sum()
    assert torch.isclose(t.total, ppo)
    assert float(t.behaviour_weight) == 2.0  # sum of two weights of 1


def test_gradient_flows_only_through_current_policy():
    logp = torch.tensor([-1.0, -0.5], requires_grad=True)
    prox = torch.tensor([-1.1, -0.4], requires_grad=True)
    behav = torch.tensor([-3.0, -0.4])
    z = torch.zeros(2)
    t = decoupled_ppo_loss(logp, prox.detach(), behav, torch.tensor([1.0, 1.0]), z, z, z, 0.2, 2.0, 0.0, 0.0)
    t.total.backward()
    assert logp.grad is not None and torch.all(logp.grad != 0)
