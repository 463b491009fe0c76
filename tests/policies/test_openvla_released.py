"""policy=openvla from a released OpenVLA folder (a tiny copy in the published layout, with a
Llama-style tokenizer.json): the family's forward is the released model's own forward on the
unpadded prompt, act and evaluate agree, actions are OpenVLA's de-tokenised and un-normalised
ones, a folder this run cannot use is refused before any rank starts, and it trains through the
engine with the Generator's and Trainer's log-probs equal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError, PolicyConfig
from rlvla3.policies import make_policy, sample_layout
from rlvla3.policies.openvla import prismatic
from rlvla3.policies.openvla.layout import OpenVLAPrompt
from rlvla3.world import Spec, validate
from tests.conftest import LOGP_CHECK, TOY, check_every_shard_consumed_once, needs_mpi, run_logprob_check

LIBERO_STATS = {"libero_spatial_no_noops": {"action": {"q01": [-0.8, -0.7, -0.9, -0.1, -0.2, -0.3, 0.0],
                                                       "q99": [0.9, 0.8, 0.9, 0.1, 0.2, 0.3, 1.0],
                                                       "mask": [True] * 6 + [False]}}}
TOY_STATS = {"toy": {"action": {"q01": [-1.0, -1.0], "q99": [1.0, 1.0], "mask": [True, True]}}}
TEXT = "pick up the black bowl between the plate and the ramekin and place it on the plate"


@pytest.fixture(scope="module")
def libero_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openvla-libero")
    prismatic.write_tiny_folder(folder, LIBERO_STATS)
    return folder


def build(folder, decoding="autoregressive", chunk=1, length=48, cams=1):
    pcfg = PolicyConfig(name="openvla", pretrained=str(folder), decoding=decoding, chunk=chunk, action_bins=256,
                        instruction_len=length, lora_rank=0)   # full fine-tuning: every weight trains
    sp = Spec(cams, 32, 8, 7, length, 512, sample_layout(pcfg, 7))

    class Cfg:
        policy = pcfg
    return make_policy(Cfg, sp), sp


def observation(sp, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 255, (n, sp.cameras, 32, 32, 3), generator=g, dtype=torch.uint8)
    return images, torch.randn(n, 8, generator=g)


def released_forward(policy, image, ids, actions):
    """The released model as its own code runs it, on one unpadded sequence: [BOS, 256 patches,
    the rest of the prompt, 29871, action tokens]; logits of the 256 action ids where each action
    token is predicted."""
    vla = policy.vla
    patches = vla.patch_features(prismatic.pixels(image[None], policy.pre))
    tokens = torch.tensor([ids + [prismatic.LLAMA_VOCAB - 1 - int(b) for b in actions[:-1]]])
    words = vla.lm.get_input_embeddings()(tokens)
    emb = torch.cat([words[:, :1], patches, words[:, 1:]], 1)
    logits = vla.lm(inputs_embeds=emb).logits[0, -len(actions):]
    return logits[:, prismatic.LLAMA_VOCAB - 1 - torch.arange(256)]


def test_the_familys_forward_is_the_released_models_own_on_the_unpadded_prompt(libero_folder):
    policy, sp = build(libero_folder)
    encode = OpenVLAPrompt(libero_folder, sp.instruction_len)
    images, proprio = observation(sp, 2)
    tokens = torch.from_numpy(np.stack([encode(TEXT), encode("Lift the cube")]))
    assert (tokens[0] != 0).sum() > (tokens[1] != 0).sum() and tokens[1, -1] == 0   # right padding differs per row
    sample = torch.randint(0, 256, (2, 7), dtype=torch.int32)
    with torch.no_grad():
        logits, _ = policy._logits_and_value(images, proprio, tokens, sample)
        for row, text in enumerate((TEXT, "Lift the cube")):
            ref = released_forward(policy, images[row, 0], encode.ids(text), sample[row])
            assert torch.allclose(logits[row], ref, atol=1e-4), f"row {row}: {(logits[row] - ref).abs().max():.2e}"


@pytest.mark.parametrize("decoding,chunk", [("autoregressive", 1), ("parallel", 2)])
def test_act_and_evaluate_agree_and_train(libero_folder, decoding, chunk):
    policy, sp = build(libero_folder, decoding, chunk, cams=2)
    encode = OpenVLAPrompt(libero_folder, sp.instruction_len)
    images, proprio = observation(sp, 3)
    tokens = torch.from_numpy(np.stack([encode(t) for t in (TEXT, "lift the cube", "open the top drawer")]))
    noise = torch.rand(3, *sp.sample.noise_shape)
    sample, logp, value = policy.act(images, proprio, tokens, noise)
    assert sample.shape == (3, chunk * 7) and int(sample.min()) >= 0 and int(sample.max()) < 256
    one = policy.act(images[1:2], proprio[1:2], tokens[1:2], noise[1:2])
    assert torch.equal(one[0], sample[1:2]), "a sample depends on its batch"
    lp, ent, v = policy.evaluate(images, proprio, tokens, sample)
    assert torch.allclose(lp, logp, atol=1e-4) and torch.allclose(v, value, atol=1e-5)
    (lp.sum() + v.sum() - 0.01 * ent.sum()).backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"value_head.weight", "vla.projector.fc1.weight", "vla.lm.model.layers.0.self_attn.q_proj.weight",
            "vla.towers.0.encoder.layer.0.mlp.fc1.weight"} <= grads


def test_actions_are_openvlas_bin_centres_unnormalised_with_the_gripper_in_the_envs_sign(libero_folder):
    policy, _ = build(libero_folder)
    centres = prismatic.bin_centres(256).numpy()
    sample = np.array([[0, 255, 127, 128, 10, 200, 250], [254, 0, 64, 192, 100, 150, 3]])
    a = policy.to_env_action(sample)
    assert a.shape == (2, 1, 7) and a.dtype == np.float32
    q01, q99 = (np.array(LIBERO_STATS["libero_spatial_no_noops"]["action"][k]) for k in ("q01", "q99"))
    bins = np.minimum(sample, 254)   # OpenVLA: 256 tokens, 255 bin centres (the last token maps to the last centre)
    want = 0.5 * (centres[bins[:, :6]] + 1) * (q99[:6] - q01[:6]) + q01[:6]
    np.testing.assert_allclose(a[:, 0, :6], np.clip(want, -1, 1), atol=1e-6)
    # gripper: the RLDS bin centre (1 = open) -> the env's -1 open / +1 closed
    assert a[0, 0, 6] == -1.0 and a[1, 0, 6] == 1.0
    # the round trip OpenVLA trains with: actions -> tokens -> actions within half a bin
    x = torch.tensor(want, dtype=torch.float32)
    stats = {k: v[:6] for k, v in policy.stats.items()}
    back = prismatic.tokens_to_actions(prismatic.actions_to_tokens(x, stats), stats)
    assert torch.allclose(back, x, atol=(q99[:6] - q01[:6]).max() / 255 + 1e-6)


def test_expert_actions_become_the_bins_that_decode_back_to_them(libero_folder):
    """SFT's targets in the folder's units: normalised by its q01/q99 and binned, the gripper in
    the dataset's 1 open / 0 closed (decoded: the envs' -1 / +1)."""
    policy, sp = build(libero_folder, decoding="parallel", chunk=2)
    rng = np.random.default_rng(0)
    q01, q99 = (np.array(LIBERO_STATS["libero_spatial_no_noops"]["action"][k]) for k in ("q01", "q99"))
    a = rng.uniform(q01, q99, (5, 2, 7)).astype(np.float32).clip(-1, 1)
    a[..., 6] = rng.choice([-1.0, 1.0], (5, 2))
    sample = policy.expert_sample(sp.sample, a, 256)
    assert sample.shape == (5, *sp.sample.shape) and sample.dtype == np.dtype(sp.sample.dtype) and sample.max() < 256
    back = policy.to_env_action(sample)
    np.testing.assert_array_equal(back[..., 6], a[..., 6])
    assert np.abs(back[..., :6] - a[..., :6]).max() <= (q99 - q01)[:6].max() / 255 + 1e-6   # within one bin


def test_a_folder_this_run_cannot_use_is_refused_before_any_rank_starts(libero_folder, tmp_path):
    toy = ["+experiment=toy", "policy=openvla", "policy.action_bins=256", "policy.instruction_len=48"]
    with pytest.raises(ConfigError, match=r"7-D action; this env's action is 2-D"):
        validate(compose([*toy, f"policy.pretrained={libero_folder}"]))
    toy_folder = tmp_path / "toy-openvla"
    prismatic.write_tiny_folder(toy_folder, {**TOY_STATS, "bridge_orig": TOY_STATS["toy"]})
    with pytest.raises(ConfigError, match=r"norm_stats for \['bridge_orig', 'toy'\]: set policy.unnorm_key"):
        validate(compose([*toy, f"policy.pretrained={toy_folder}"]))
    with pytest.raises(ConfigError, match=r"policy.unnorm_key='fractal' is not among"):
        validate(compose([*toy, f"policy.pretrained={toy_folder}", "policy.unnorm_key=fractal"]))
    validate(compose([*toy, f"policy.pretrained={toy_folder}", "policy.unnorm_key=toy"]))
    (toy_folder / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"no tokenizer.json"):
        validate(compose([*toy, f"policy.pretrained={toy_folder}", "policy.unnorm_key=toy"]))


def test_prompt_longer_than_instruction_len_names_the_setting(libero_folder):
    encode = OpenVLAPrompt(libero_folder, 8)
    with pytest.raises(ValueError, match=r"raise policy.instruction_len to at least \d+"):
        encode(TEXT)


@needs_mpi
@pytest.mark.slow
def test_a_released_openvla_trains_through_the_engine_with_matching_logprobs(tmp_path):
    folder = tmp_path / "openvla-toy"
    prismatic.write_tiny_folder(folder, TOY_STATS)
    over = [*TOY, *LOGP_CHECK, "policy=openvla",
            f"policy.pretrained={folder}", "policy.action_bins=256", "policy.instruction_len=32",
            "policy.decoding=autoregressive"]
    run = run_logprob_check(tmp_path, over, "released openvla")
    check_every_shard_consumed_once(run, 2, 256)
