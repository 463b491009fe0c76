"""policy=openvla_oft from a released OpenVLA-OFT folder (a tiny copy: the Prismatic folder plus
action_head--*.pt and proprio_projector--*.pt saved with DDP names): the modules load exactly and
a differing file is named; the forward is OFT's (bidirectional attention, the hidden states one
position before each placeholder, the padding changing nothing); the Gaussian around the
regressed chunk has act = evaluate; actions are un-normalised with the gripper in the envs' sign;
it trains through the engine with the Generator's and Trainer's log-probs equal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError, PolicyConfig
from rlvla3.engine.checkpoints import CheckpointError
from rlvla3.engine.torch_learner import frozen_fingerprint, load_model
from rlvla3.policies import make_policy, sample_layout
from rlvla3.policies.openvla import oft as openvla_oft
from rlvla3.policies.openvla import prismatic
from rlvla3.policies.openvla.layout import OpenVLAPrompt
from rlvla3.world import Spec, validate
from tests.conftest import LOGP_CHECK, TOY, needs_mpi, run_logprob_check

STATS = {"libero_spatial_no_noops": {
    "action": {"q01": [-0.8, -0.7, -0.9, -0.1, -0.2, -0.3, 0.0], "q99": [0.9, 0.8, 0.9, 0.1, 0.2, 0.3, 1.0],
               "mask": [True] * 6 + [False]},
    "proprio": {"q01": [-0.3, -0.3, 0.0, -3.0, -3.0, -3.0, 0.0, -0.04], "q99": [0.3, 0.3, 1.2, 3.0, 3.0, 3.0, 0.04, 0.0]}}}
TEXT = "pick up the black bowl between the plate and the ramekin and place it on the plate"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    f = tmp_path_factory.mktemp("oft")
    openvla_oft.write_tiny_folder(f, STATS, action_dim=7, proprio_dim=8)
    return f


def build(folder, chunk=2):
    pcfg = PolicyConfig(name="openvla_oft", pretrained=str(folder), chunk=chunk, instruction_len=48, flow_noise_std=0.1,
                        lora_rank=0)   # full fine-tuning: every weight trains
    sp = Spec(2, 32, 8, 7, 48, 512, sample_layout(pcfg, 7))

    class Cfg:
        policy = pcfg
    return make_policy(Cfg, sp), sp


def observation(sp, n, folder, texts):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (n, sp.cameras, 32, 32, 3), generator=g, dtype=torch.uint8)
    encode = OpenVLAPrompt(folder, sp.instruction_len)
    return images, torch.randn(n, 8, generator=g) * 0.2, torch.from_numpy(np.stack([encode(t) for t in texts])), encode


def test_the_module_files_load_exactly_and_a_differing_one_is_named(folder, tmp_path):
    policy, _ = build(folder)
    saved = torch.load(folder / "action_head--150000_checkpoint.pt", weights_only=True)
    assert all(k.startswith("module.model.") for k in saved) and saved["module.model.fc1.weight"].dtype == torch.bfloat16
    assert torch.equal(policy.action_head.model.fc1.weight, saved["module.model.fc1.weight"].float())
    proj = torch.load(folder / "proprio_projector--150000_checkpoint.pt", weights_only=True)
    assert torch.equal(policy.proprio_projector.fc2.bias, proj["module.fc2.bias"])
    del saved["module.model.mlp_resnet_blocks.1.ffn.1.weight"]
    torch.save(saved, folder / "action_head--150000_checkpoint.pt")
    try:
        with pytest.raises(prismatic.LayoutError, match=r"missing \['model\.mlp_resnet_blocks\.1\.ffn\.1\.weight'\]"):
            build(folder)
    finally:
        openvla_oft.write_tiny_folder(folder, STATS, action_dim=7, proprio_dim=8)


def reference_mean(policy, images, proprio, ids, causal=False):
    """OFT's forward on one unpadded sequence: [BOS, patches of both cameras, proprio, prompt,
    K*D zeros, </s>], bidirectional (or, to show the difference, causal) attention."""
    vla, n_act = policy.vla, policy.chunk * policy.action_dim
    lm = vla.lm
    patches = vla.patch_features(prismatic.pixels(images, policy.pre, policy.crop)).reshape(1, -1, lm.config.hidden_size)
    words = lm.get_input_embeddings()(torch.tensor([ids]))
    prop = policy.proprio_projector(policy._proprio(proprio[None]))[:, None]
    eos = lm.get_input_embeddings()(torch.tensor([[2]]))
    emb = torch.cat([words[:, :1], patches, prop, words[:, 1:], torch.zeros(1, n_act, words.shape[-1]), eos], 1)
    s = emb.shape[1]
    mask = torch.zeros(1, 1, s, s) if not causal else torch.full((s, s), torch.finfo(emb.dtype).min).triu(1)[None, None]
    h = lm.model(inputs_embeds=emb, attention_mask=mask).last_hidden_state
    start = 2 + patches.shape[1] + len(ids) - 1
    feats = h[0, start - 1:start - 1 + n_act].reshape(1, policy.chunk, -1)
    return policy.action_head.model(feats)[0]


def test_the_forward_is_ofts_bidirectional_one_and_padding_changes_nothing(folder):
    policy, sp = build(folder)
    texts = (TEXT, "lift the cube")
    images, proprio, tokens, encode = observation(sp, 2, folder, texts)
    with torch.no_grad():
        mean, _ = policy.mean_and_value(images, proprio, tokens)
        for row, text in enumerate(texts):
            ref = reference_mean(policy, images[row], proprio[row], encode.ids(text))
            assert torch.allclose(mean[row], ref, atol=1e-4), f"row {row}: {(mean[row] - ref).abs().max():.2e}"
        causal = reference_mean(policy, images[1], proprio[1], encode.ids(texts[1]), causal=True)
    assert not torch.allclose(mean[1], causal, atol=1e-3), "the forward is causal; OFT attends bidirectionally"


def test_expert_actions_become_the_regressed_chunk_that_maps_back_to_them(folder):
    policy, sp = build(folder)
    a = np.random.default_rng(0).uniform(-0.05, 0.05, (4, 2, 7)).astype(np.float32)
    a[..., 6] = [[-1, 1], [1, 1], [-1, -1], [1, -1]]
    x = policy.expert_sample(sp.sample, a, 256)
    assert x.shape == (4, *sp.sample.shape) and np.abs(x).max() <= 1
    np.testing.assert_array_equal(x[..., 6], np.where(a[..., 6] < 0, 1.0, 0.0))   # OFT's dataset: 1 open
    np.testing.assert_allclose(policy.to_env_action(x), a, atol=1e-6)


def test_the_gaussian_policy_acts_evaluates_and_trains(folder):
    policy, sp = build(folder)
    images, proprio, tokens, _ = observation(sp, 3, folder, (TEXT, "lift the cube", "open the drawer"))
    noise = torch.randn(3, *sp.sample.noise_shape)
    sample, logp, value = policy.act(images, proprio, tokens, noise)
    assert sample.shape == (3, 2, 7)
    one = policy.act(images[2:], proprio[2:], tokens[2:], noise[2:])
    assert torch.allclose(one[0], sample[2:], atol=1e-5), "a sample depends on its batch"
    lp, ent, v = policy.evaluate(images, proprio, tokens, sample)
    assert torch.allclose(lp, logp, atol=1e-4) and torch.allclose(v, value, atol=1e-5)
    per_coordinate = policy.evaluate(images, proprio, tokens, sample, per_token=True)[0]   # algo.ratio=token
    assert per_coordinate.shape == (3, 2 * 7) and torch.allclose(per_coordinate.sum(-1), lp, atol=1e-4)
    (lp.sum() + v.sum() + 0.01 * ent.sum()).backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"log_std", "value_head.weight", "action_head.model.fc2.weight", "proprio_projector.fc1.weight",
            "vla.lm.model.layers.1.mlp.up_proj.weight", "vla.towers.1.encoder.layers.0.mlp.fc1.weight"} <= grads


def test_actions_are_unnormalised_with_the_gripper_in_the_envs_sign(folder):
    policy, _ = build(folder, chunk=1)
    a = policy.to_env_action(np.array([[[-1, 1, 0, 0.5, -0.5, 1, 0.9]], [[1, -1, 0, 0, 0, 0, 0.2]]], np.float32))
    q01, q99 = (np.array(STATS["libero_spatial_no_noops"]["action"][k][:6]) for k in ("q01", "q99"))
    want = 0.5 * (np.array([-1, 1, 0, 0.5, -0.5, 1]) + 1) * (q99 - q01) + q01
    np.testing.assert_allclose(a[0, 0, :6], np.clip(want, -1, 1), atol=1e-6)
    assert a[0, 0, 6] == -1.0 and a[1, 0, 6] == 1.0   # 0.9 (open in RLDS) -> -1; 0.2 -> +1 (closed)
    # Exactly 0.5: OFT's LIBERO evaluation takes the sign of 2a - 1 = 0 and inverts it: 0, not +1.
    half = policy.to_env_action(np.array([[[0, 0, 0, 0, 0, 0, 0.5]]], np.float32))
    assert half[0, 0, 6] == 0.0


def test_openvla_oft_needs_a_released_folder_with_its_modules(folder, tmp_path):
    with pytest.raises(ConfigError, match=r"policy=openvla_oft loads a released OpenVLA-OFT folder"):
        validate(compose(["+experiment=toy", "policy=openvla_oft"]))
    libero = ["env=libero", "policy=openvla_oft"]
    validate(compose([*libero, f"policy.pretrained={folder}"]))
    with pytest.raises(ConfigError, match=r"8-D proprio; this env's proprio is 9-D"):   # robosuite's state is not LIBERO's
        validate(compose(["policy=openvla_oft", f"policy.pretrained={folder}"]))
    plain = tmp_path / "plain"
    prismatic.write_tiny_folder(plain, STATS)
    with pytest.raises(ConfigError, match=r"no single action_head--<step>_checkpoint.pt"):
        validate(compose([*libero, f"policy.pretrained={plain}"]))


@needs_mpi
@pytest.mark.slow
def test_a_released_oft_trains_its_lora_adapters_through_the_engine_with_matching_logprobs(tmp_path):
    """OFT's single-GPU recipe: LoRA adapters on the backbone (its linear weights frozen in
    bfloat16), the action head and proprio projector in full, layers recomputed in backward.
    Generators receive the trainable parameters only; the frozen base ends the run bit for bit
    as loaded, the adapters and heads have moved."""
    from rlvla3.world import spec

    dims = spec(compose(TOY))
    stats = {"toy": {"action": {"q01": [-1.0] * dims.action_dim, "q99": [1.0] * dims.action_dim},
                     "proprio": {"q01": [-1.0] * dims.proprio_dim, "q99": [1.0] * dims.proprio_dim}}}
    openvla_oft.write_tiny_folder(tmp_path / "oft", stats, dims.action_dim, dims.proprio_dim)
    over = [*TOY, *LOGP_CHECK, "policy=openvla_oft", f"policy.pretrained={tmp_path / 'oft'}", "policy.chunk=2",
            "policy.instruction_len=32", "policy.image_crop=1.0", "policy.lora_rank=4", "policy.grad_checkpointing=true"]
    run = run_logprob_check(tmp_path, over, "released openvla_oft, LoRA")
    fresh = make_policy(compose(over), spec(compose(over)))
    start = fresh.state_dict()
    ckpt = torch.load(run / "ckpt" / "v000002.pt", weights_only=True)
    end, frozen = ckpt["model"], ckpt["frozen"]
    base = [k for k in start if ".base_layer." in k]
    assert base and all(start[k].dtype == torch.bfloat16 for k in base if k.endswith("weight"))
    # The checkpoint holds what trains and its optimizer state, no frozen base weight, and names
    # the base by a fingerprint of its values at save time: the base as loaded, not moved.
    assert set(base) <= set(frozen["keys"]) and end.keys() == start.keys() - set(frozen["keys"])
    assert frozen["fingerprint"] == frozen_fingerprint(fresh, frozen["keys"])
    assert str(tmp_path / "oft") in frozen["base"]
    trainable = sum(p.numel() for p in fresh.parameters() if p.requires_grad)
    held = sum(t.numel() * t.element_size() for t in (*end.values(), *tensors(ckpt["optimizer"])))
    assert held <= 16 * trainable, (held, trainable)
    changed = {k for k in end if not torch.equal(start[k], end[k])}
    assert any(".lora_B." in k for k in changed) and any(k.startswith("action_head.") for k in changed)
    load_model(fresh, end, frozen, "v000002.pt")    # onto the same base: loads
    moved = make_policy(compose(over), spec(compose(over)))
    with torch.no_grad():
        moved.get_parameter(next(k for k in base if k.endswith("weight"))).add_(1.0)
    with pytest.raises(CheckpointError, match=r"trained on policy.pretrained=.*this policy's frozen weights are not"):
        load_model(moved, end, frozen, "v000002.pt")


def tensors(tree) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state_dict (or any nest of dicts and lists)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return [t for v in items for t in tensors(v)]
