"""Policy families in-process: sampling depends only on a sample's own noise, evaluate recomputes
act's log-prob, gradients reach the parameters, and real checkpoints load from a local path."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rlvla3.config import PolicyConfig
from rlvla3.policies import sample_layout
from rlvla3.world import Spec as EnvSpec

pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[vla]')")

FAMILIES = {
    "tiny": dict(name="tiny", chunk=2),
    "openvla_parallel": dict(name="openvla", chunk=2),
    "openvla_autoregressive": dict(name="openvla", lm="llama", decoding="autoregressive"),
    "pi0": dict(name="pi0", chunk=2, denoise_steps=3),
}


def build(**fields):
    from rlvla3.policies import make_policy

    pcfg = PolicyConfig(d_model=32, layers=1, heads=2, patch=4, vocab=64, action_bins=8, instruction_len=6, **fields)
    sp = EnvSpec(1, 8, 3, 2, 6, 64, sample_layout(pcfg, 2))

    class Cfg:
        policy = pcfg
    return make_policy(Cfg, sp), sp


def batch(sp, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (n, 1, 8, 8, 3), generator=g, dtype=torch.uint8)
    tokens = torch.randint(2, 64, (n, 6), generator=g, dtype=torch.int32)
    tokens[:, 4:] = 0   # padding
    draw = torch.randn if sp.sample.noise == "normal" else torch.rand
    return images, torch.randn(n, 3, generator=g), tokens, draw((n, *sp.sample.noise_shape), generator=g)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_act_evaluate_agree_and_train(family):
    policy, sp = build(**FAMILIES[family])
    images, proprio, tokens, noise = batch(sp, 5)
    sample, logp, value = policy.act(images, proprio, tokens, noise)
    assert tuple(sample.shape) == (5, *sp.sample.shape)
    one = policy.act(images[:1], proprio[:1], tokens[:1], noise[:1])
    assert torch.allclose(one[0].float(), sample[:1].float(), atol=1e-5), "a sample depends on its batch"
    lp, ent, v = policy.evaluate(images, proprio, tokens, sample)
    assert torch.allclose(lp, logp, atol=1e-4) and torch.allclose(v, value, atol=1e-5)
    # algo.ratio=token: one log-prob per action token / coordinate of the chunk, which sum to the sample's.
    per_token = policy.evaluate(images, proprio, tokens, sample, per_token=True)[0]
    assert per_token.shape == (5, sp.chunk * 2) and torch.allclose(per_token.sum(-1), lp, atol=1e-4)
    (lp.sum() + v.sum() - ent.sum()).backward()
    assert sum(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in policy.parameters()) > 0
    actions = policy.to_env_action(sample.detach().numpy())
    assert actions.shape == (5, sp.chunk, 2) and np.abs(actions).max() <= 1.0
    # SFT's cloning loss (-log pi of the expert's sample; pi0: flow matching) trains the policy.
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = policy.bc_loss(images, proprio, tokens, sample, torch.from_numpy(actions)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < np.mean(losses[:5]), losses


def test_pretrained_checkpoints_load_from_a_local_path(tmp_path):
    """pi0: a PI0 checkpoint dir (openvla's released folder: tests/policies/test_openvla_released.py). A
    missing one is named in the error (nothing is ever downloaded)."""
    pi0, _ = build(name="pi0", chunk=2)
    pi0.model.save_pretrained(tmp_path / "pi0")
    from rlvla3.policies.pi.layout import Normaliser, write_normaliser

    # a released π0 folder carries LeRobot's normaliser (identity here: the test is about loading)
    write_normaliser(tmp_path / "pi0", Normaliser({"observation.state": "STATE", "action": "ACTION"},
                                                  {"STATE": "IDENTITY", "ACTION": "IDENTITY"}), "policy_preprocessor")
    again, _ = build(name="pi0", chunk=2, pretrained=str(tmp_path / "pi0"), init_seed=7, lora_rank=0)
    assert torch.equal(again.model.action_out_proj.weight, pi0.model.action_out_proj.weight)

    with pytest.raises(FileNotFoundError, match=r"policy.pretrained=.*missing: no config\.json"):
        build(name="openvla", pretrained=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="chunk_size=2"):
        build(name="pi0", chunk=4, pretrained=str(tmp_path / "pi0"))
    # A checkpoint that does not match its config fails naming the tensors (transformers alone
    # would only report them and start the missing ones at random).
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "pi0" / "model.safetensors")
    gone = sorted(weights)[0]
    del weights[gone]
    weights["action_out_proj.extra"] = torch.zeros(2)
    save_file(weights, tmp_path / "pi0" / "model.safetensors", metadata={"format": "pt"})
    # (the missing one under the model's name: transformers' conversion mapping may prefix it)
    with pytest.raises(ValueError, match=rf"missing keys \['([\w.]+\.)?{re.escape(gone)}'\]; unexpected keys \['action_out_proj\.extra'\]"):
        build(name="pi0", chunk=2, pretrained=str(tmp_path / "pi0"))


def test_auto_device_spreads_the_ranks_of_a_node_over_its_gpus():
    """policy.device=auto was torch.device("cuda") (GPU 0) in every process of a node."""
    from rlvla3.policies.base import auto_device

    assert auto_device(0, {"SLURM_LOCALID": "3"}) == "cpu"
    assert auto_device(4, {"SLURM_LOCALID": "1"}) == "cuda:1"
    assert auto_device(4, {"OMPI_COMM_WORLD_LOCAL_RANK": "6"}) == "cuda:2"
    assert auto_device(1, {"SLURM_LOCALID": "5"}) == "cuda:0"      # one GPU bound per task
    assert auto_device(2, {}) == "cuda:0"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_noise_acts_on_the_most_likely_action(family):
    """generator.greedy (evaluate --greedy): token families act on every token's argmax, whatever
    noise was drawn, and no sampled action is more likely; a chain runs the deterministic flow from
    its drawn start (the start still matters, the injected noise no longer does). Token by token
    (autoregressive) the argmax is greedy per token, not the most likely sequence."""
    from rlvla3.policies.sampling import greedy_noise

    policy, sp = build(**FAMILIES[family])
    images, proprio, tokens, noise = batch(sp, 4)
    other = batch(sp, 4, seed=1)[3]
    with torch.no_grad():
        greedy, greedy_logp, _ = policy.act(images, proprio, tokens, torch.from_numpy(greedy_noise(sp.sample, noise.numpy())))
        if sp.sample.kind == "tokens":
            again = policy.act(images, proprio, tokens, torch.from_numpy(greedy_noise(sp.sample, other.numpy())))[0]
            assert torch.equal(greedy, again)
            draws = [policy.act(images, proprio, tokens, batch(sp, 4, seed=s)[3]) for s in range(2, 22)]
            # The first token has no prefix: its argmax is at least as likely as any draw of it.
            first = lambda sample: policy.evaluate(images, proprio, tokens, sample, per_token=True)[0][:, 0]  # noqa: E731
            assert all((first(greedy) >= first(d[0]) - 1e-5).all() for d in draws)
            if FAMILIES[family].get("decoding") != "autoregressive":   # independent tokens: the joint too
                sampled_logp = torch.stack([d[1] for d in draws])
                assert (greedy_logp[None] >= sampled_logp - 1e-5).all()
                assert (greedy_logp[None] > sampled_logp + 1e-3).any(), "sampling never drew a less likely action"
        else:
            shared_start = other.clone()
            shared_start[:, 0] = noise[:, 0]
            again = policy.act(images, proprio, tokens, torch.from_numpy(greedy_noise(sp.sample, shared_start.numpy())))[0]
            assert torch.allclose(greedy, again)
            moved = policy.act(images, proprio, tokens, torch.from_numpy(greedy_noise(sp.sample, other.numpy())))[0]
            assert not torch.allclose(greedy[:, -1], moved[:, -1])
            sampled = policy.act(images, proprio, tokens, noise)[0]
            assert not torch.allclose(greedy[:, -1], sampled[:, -1]), "the injected noise changed nothing"


def test_a_checkpoint_from_before_peft_loads_its_adapters_by_their_old_names():
    """Before LoRA went through peft a checkpoint named an adapter `<linear>.lora_A.weight`; a
    resume or policy.init_from from one refused it (unexpected keys). They load by peft's names."""
    from rlvla3.engine.torch_learner import frozen_fingerprint, frozen_keys, load_model
    from rlvla3.policies.lora import apply_lora, trainable

    def adapted():
        policy, _ = build(name="openvla", chunk=2)
        apply_lora(policy, 4, 8.0, "float32")
        return policy

    trained = adapted()
    with torch.no_grad():
        for p in trainable(trained):
            p.add_(0.1 * torch.randn_like(p))
    keys = frozen_keys(trained)
    old = {re.sub(r"\.lora_([AB])\.default\.weight$", r".lora_\1.weight", k): v
           for k, v in trained.state_dict().items() if k not in keys}
    assert sum(".lora_A.weight" in k for k in old) >= 2 and not any(".default." in k for k in old)
    fresh = adapted()
    frozen = {"keys": keys, "fingerprint": frozen_fingerprint(fresh, keys), "base": "the same random base"}
    load_model(fresh, old, frozen, "a pre-peft checkpoint")
    for (name, a), b in zip(trained.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
