"""GAE and the decoupled PPO loss against slow, obviously-correct reference loops."""
import math

import numpy as np
import pytest
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


def test_stale_rows_behaviour_weights_from_the_loss_sums():
    """The history's stale_weight / stale_ess come from the loss's summed w and w^2 over all rows:
    fresh rows (w = 1) are taken off and the stale rows' own mean and (sum w)^2 / (n sum w^2) are left,
    with the clip applied (the third stale row's weight e^2 is cut to c = 2)."""
    from rlvla3.engine.history import stale_weights

    behav = torch.tensor([-1.0, -2.0, -1.0, -1.0, -3.0])
    prox = torch.tensor([-1.0, -2.0, -1.7, -0.6, -1.0])   # rows 0-1 fresh (prox = behav), 2-4 stale
    z = torch.zeros(5)
    t = decoupled_ppo_loss(prox, prox, behav, z, z, z, z, 0.2, 2.0, 0.0, 0.0)
    w = np.minimum(np.exp((prox - behav).numpy().astype(np.float64)[2:]), 2.0)
    got = stale_weights(5.0, 3.0, float(t.behaviour_weight), float(t.behaviour_weight_sq))
    assert got["stale_weight"] == pytest.approx(w.mean(), rel=1e-5)
    assert got["stale_ess"] == pytest.approx(w.sum() ** 2 / (3 * (w ** 2).sum()), rel=1e-5)
    assert 0 < got["stale_ess"] < 1
    assert all(math.isnan(v) for v in stale_weights(5.0, 0.0, 5.0, 5.0).values())


def test_gradient_flows_only_through_current_policy():
    logp = torch.tensor([-1.0, -0.5], requires_grad=True)
    prox = torch.tensor([-1.1, -0.4], requires_grad=True)
    behav = torch.tensor([-3.0, -0.4])
    z = torch.zeros(2)
    t = decoupled_ppo_loss(logp, prox.detach(), behav, torch.tensor([1.0, 1.0]), z, z, z, 0.2, 2.0, 0.0, 0.0)
    t.total.backward()
    assert logp.grad is not None and torch.all(logp.grad != 0)


def test_token_ratios_match_a_per_token_loop_and_clip_each_token_on_its_own():
    """algo.ratio=token: each action token's ratio is clipped on its own, the behaviour weight
    stays one per sample; at r = 1 the gradient is the sequence ratio's."""
    g = torch.Generator().manual_seed(1)
    n, T = 16, 7
    logp = torch.randn(n, T, generator=g) * 0.3 - 1
    prox = logp + torch.randn(n, T, generator=g) * 0.3
    behav = prox.sum(-1) + torch.randn(n, generator=g) * 0.5
    adv, value, ret, ent = (torch.randn(n, generator=g) for _ in range(4))
    clip, c = 0.2, 2.0
    terms = decoupled_ppo_loss(logp, prox, behav, adv, value, ret, ent, clip, c, 0.0, 0.0)
    total = clipped = 0.0
    for i in range(n):
        w = min(math.exp(float(prox[i].sum() - behav[i])), c)
        for t in range(T):
            r = math.exp(float(logp[i, t] - prox[i, t]))
            total += -w * min(r * float(adv[i]), min(max(r, 1 - clip), 1 + clip) * float(adv[i]))
            clipped += (abs(r - 1) > clip) / T
    assert np.isclose(float(terms.total), total, rtol=1e-5)
    assert np.isclose(float(terms.clip_frac), clipped, rtol=1e-5)

    # On-policy (r = 1 everywhere): each token's gradient is the sequence loss's gradient of the sum.
    tok = logp.clone().requires_grad_(True)
    seq = logp.sum(-1).clone().requires_grad_(True)
    z = torch.zeros(n)
    decoupled_ppo_loss(tok, logp, logp.sum(-1), adv, z, z, z, clip, c, 0.0, 0.0).total.backward()
    decoupled_ppo_loss(seq, logp.sum(-1), logp.sum(-1), adv, z, z, z, clip, c, 0.0, 0.0).total.backward()
    torch.testing.assert_close(tok.grad, seq.grad[:, None].expand(n, T))

    # One token of a positive-advantage sample moved past 1 + clip: only that token stops. The
    # sequence ratio of the same sample (the product) is past the clip too and stops all of them.
    moved = torch.zeros(1, T)
    moved[0, 2] = math.log(1.5)
    tok = moved.clone().requires_grad_(True)
    seq = moved.sum(-1).clone().requires_grad_(True)
    one, zero1 = torch.ones(1), torch.zeros(1)
    decoupled_ppo_loss(tok, torch.zeros(1, T), zero1, one, zero1, zero1, zero1, clip, c, 0.0, 0.0).total.backward()
    decoupled_ppo_loss(seq, zero1, zero1, one, zero1, zero1, zero1, clip, c, 0.0, 0.0).total.backward()
    assert tok.grad[0, 2] == 0 and (tok.grad[0, [0, 1, 3, 4, 5, 6]] == -1).all()
    assert seq.grad[0] == 0


def vtrace_reference(r, v, term, trunc, boot, log_rho, gamma, rho_clip, c_clip):
    """IMPALA's definition written out: v_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i) delta_t,
    summed until the episode or the segment ends."""
    T, N = r.shape
    vs = np.zeros((T, N))
    adv = np.zeros((T, N))
    ratio = np.exp(log_rho.astype(np.float64))

    def v_next(t, n):
        if term[t, n]:
            return 0.0
        if trunc[t, n]:
            return v[t, n]
        return boot[n] if t == T - 1 else v[t + 1, n]

    for n in range(N):
        for s in range(T):
            total, disc, prod_c = 0.0, 1.0, 1.0
            for t in range(s, T):
                rho_t = min(rho_clip, ratio[t, n])
                total += disc * prod_c * rho_t * (r[t, n] + gamma * v_next(t, n) - v[t, n])
                if term[t, n] or trunc[t, n]:
                    break
                disc *= gamma
                prod_c *= min(c_clip, ratio[t, n])
            vs[s, n] = v[s, n] + total
    for n in range(N):
        for s in range(T):
            ended = term[s, n] or trunc[s, n] or s == T - 1
            nxt = v_next(s, n) if ended else vs[s + 1, n]
            adv[s, n] = min(rho_clip, ratio[s, n]) * (r[s, n] + gamma * nxt - v[s, n])
    return vs, adv


def _segment(rng, T, N):
    r = rng.normal(size=(T, N)).astype(np.float32)
    v = rng.normal(size=(T, N)).astype(np.float32)
    term = rng.random((T, N)) < 0.1
    trunc = (rng.random((T, N)) < 0.1) & ~term
    return r, v, term, trunc, rng.normal(size=N).astype(np.float32)


def test_vtrace_matches_reference_sums():
    from rlvla3.algo import vtrace
    rng = np.random.default_rng(1)
    r, v, term, trunc, boot = _segment(rng, 19, 4)
    log_rho = rng.normal(scale=0.7, size=r.shape).astype(np.float32)
    vs, adv = vtrace(r, v, term, trunc, boot, log_rho, 0.95, 1.0, 0.9)
    ref_vs, ref_adv = vtrace_reference(r, v, term, trunc, boot, log_rho, 0.95, 1.0, 0.9)
    np.testing.assert_allclose(vs, ref_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-4, atol=1e-4)


def test_vtrace_on_policy_is_lambda_one_return():
    """rho = c = 1 (on-policy, clips >= 1): v_s is the n-step bootstrapped return, i.e. GAE(lambda=1)."""
    from rlvla3.algo import vtrace
    rng = np.random.default_rng(2)
    r, v, term, trunc, boot = _segment(rng, 17, 3)
    vs, _ = vtrace(r, v, term, trunc, boot, np.zeros_like(r), 0.9, 1.0, 1.0)
    _, ret = gae(r, v, term, trunc, boot, 0.9, 1.0)
    np.testing.assert_allclose(vs, ret, rtol=1e-5, atol=1e-5)


def test_grpo_advantages_match_group_normalisation():
    from rlvla3.algo import grpo_advantages
    R = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0], np.float32)
    adv = grpo_advantages(R)
    mean = sum(R) / len(R)
    std = math.sqrt(sum((x - mean) ** 2 for x in R) / len(R))
    np.testing.assert_allclose(adv, [(x - mean) / (std + 1e-6) for x in R], rtol=1e-5)
    assert not grpo_advantages(np.ones(4, np.float32)).any(), "equal outcomes carry no signal"


def test_kl_k3_is_unbiased_for_the_true_kl():
    from rlvla3.algo import kl_k3
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(6, generator=g), 0)
    q = torch.softmax(torch.randn(6, generator=g), 0)
    exact = float((p * (p.log() - q.log())).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = float(kl_k3(p.log()[x], q.log()[x]).mean())
    assert abs(est - exact) < 0.02 * max(exact, 0.05), (est, exact)
    assert float(kl_k3(p.log(), p.log()).abs().max()) == 0.0


def test_weighted_loss_ignores_padding_rows():
    """Rows with weight 0 (grpo rows after an episode ended) change nothing."""
    g = torch.Generator().manual_seed(4)
    n = 10
    a = [torch.randn(n, generator=g) for _ in range(7)]
    w = torch.tensor([1.0] * 6 + [0.0] * 4)
    a[0][6:], a[1][7:], a[2][8:] = 300.0, -300.0, 0.0   # padding: log-probs whose ratios overflow
    full = decoupled_ppo_loss(*a, 0.2, 2.0, 0.5, 0.01, weight=w)
    kept = decoupled_ppo_loss(*(x[:6] for x in a), 0.2, 2.0, 0.5, 0.01)
    for f in ("total", "policy", "approx_kl", "clip_frac", "behaviour_weight"):
        assert torch.isclose(getattr(full, f), getattr(kept, f)), f


def test_grpo_segment_weighs_episodes_equally_whatever_their_length():
    """GRPO's 1/|o_i|: a short success and long failures of one group move the policy by equal
    and opposite amounts (summed over rows, the failures' horizon-long episodes outweighed it)."""
    from rlvla3.algo import grpo_advantages, grpo_segment

    T, N = 10, 4
    valid = np.zeros((T, N), bool)
    lengths = [3, 10, 10, 7]
    for i, n in enumerate(lengths):
        valid[:n, i] = True
    success = np.zeros((T, N), bool)
    success[2, 0] = True                                  # env 0 succeeds at its 3rd decision
    a = {"success": success, "valid": valid, "rewards": np.zeros((T, N), np.float32)}
    adv, _, _ = grpo_segment(a, {"reset_digests": [7] * N}, "shard", None)
    per_episode = adv.sum(0)
    np.testing.assert_allclose(per_episode, grpo_advantages(success.any(0).astype(np.float32)) * np.mean(lengths),
                               rtol=1e-5)
    assert abs(adv.sum()) < 1e-4 and not adv[~valid].any()


def test_raft_segment_reinforces_every_decision_of_a_success_and_nothing_else():
    """RAFT++: advantage 1 on each valid row of an episode that succeeded, 0 on failed episodes'
    rows and on padding after an episode ended (whatever the episode's length)."""
    from rlvla3.algo import raft_segment

    T, N = 10, 4
    valid = np.zeros((T, N), bool)
    for i, n in enumerate([3, 10, 10, 7]):
        valid[:n, i] = True
    success = np.zeros((T, N), bool)
    success[2, 0] = success[6, 3] = True            # envs 0 and 3 succeed at their last decision
    a = {"success": success, "valid": valid, "rewards": np.zeros((T, N), np.float32)}
    adv, ret, _ = raft_segment(a, {}, "shard", None)
    np.testing.assert_array_equal(adv, valid * np.array([1, 0, 0, 1], np.float32))
    assert adv.dtype == np.float32 and not ret.any()
    success[2, 0] = False
    success[5, 1] = True                            # a success flag on a padding row does not count
    valid[5:, 1] = False
    np.testing.assert_array_equal(raft_segment(a, {}, "shard", None)[0], valid * np.array([0, 0, 0, 1], np.float32))


def test_lr_warms_up_then_decays_linearly_to_zero_at_the_last_step():
    from rlvla3.algo import lr_at

    assert [lr_at(1.0, s, 4, 10, False) for s in (1, 2, 4, 5, 10)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    decayed = [lr_at(1.0, s, 0, 10, True) for s in range(1, 11)]
    assert decayed[0] == 1.0 and abs(decayed[-1] - 0.1) < 1e-12            # the last step still moves
    assert all(a > b for a, b in zip(decayed, decayed[1:]))
    assert lr_at(1.0, 2, 4, 10, True) == 0.5 * 0.9                          # both at once
    assert lr_at(2e-4, 7, 0, 10, False) == 2e-4                             # constant by default


def test_grpo_shard_of_mixed_initial_states_is_quarantined_not_fatal(tmp_path):
    """A GRPO shard whose episodes started from different states is set aside and trained as
    absent (it used to raise RuntimeError out of preload, on every resume)."""
    from rlvla3.cluster.compose import compose
    from rlvla3.engine import shards
    from rlvla3.engine.metrics import Metrics
    from rlvla3.engine.simulator import SegmentBuffer
    from rlvla3.engine.torch_learner import TorchLearner
    from rlvla3.world import derive, spec

    cfg = compose(["+experiment=toy_grpo", "runtime.tensorboard=false"])
    sp = spec(cfg)
    seg = SegmentBuffer.allocate(cfg.algo.segment_steps, 2, sp)
    (tmp_path / "shards").mkdir()
    shards.write_shard(tmp_path / "shards", "s000000-g00000-q000000", seg.arrays, np.zeros(2, np.float32),
                       {"reset_digests": [1, 2], "env_ids": [0, 1]})
    learner = TorchLearner(cfg, derive(cfg), sp, Metrics(tmp_path, 0, "trainer", 0.0), 1, 0, tmp_path / "shards")
    with pytest.warns(UserWarning, match="different initial states"):
        assert learner.preload("s000000-g00000-q000000") is None
    assert learner.bad == {"s000000-g00000-q000000"} and (tmp_path / "shards" / ".bad").is_dir()
