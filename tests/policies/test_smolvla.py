"""policy=smolvla (SmolVLA) from LeRobot's folder layout (a tiny copy: same file names, config keys
and tensor names, SmolVLM2's head size, random weights): it loads back exactly and a differing
folder fails naming the tensor or setting; its prompt is the task and a newline in SmolVLM2's
tokenizer; the prefix's attention is as SmolVLA's (images and text never see the state token, the
expert's cross-attention layers read the VLM's K/V); act and evaluate agree; it trains through the
engine with the Generator's and Trainer's log-probs equal; its published configuration is
smolvla_base's 500 tensors and 450,046,176 parameters."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError
from rlvla3.policies import execute_steps, make_policy
from rlvla3.policies.base import LayoutError
from rlvla3.policies.pi.layout import Normaliser, write_normaliser
from rlvla3.policies.prompts import instruction_encoder, write_tiny_tokenizer
from rlvla3.policies.smolvla import folder as smolvla_folder
from rlvla3.policies.smolvla.layout import SmolVLAPrompt
from rlvla3.policies.smolvla.model import PUBLISHED_PARAMS, rope
from rlvla3.world import spec, validate
from tests.conftest import LOGP_CHECK, TOY, damage_tensor, needs_mpi, obs_batch, run_logprob_check

# SmolVLM2's head size (64) so the head counts read off the tensors are the ones built.
SMOLVLA_TOY = [*TOY, "policy=smolvla", "policy.d_model=128", "policy.heads=2", "policy.patch=3", "policy.chunk=3",
               "policy.denoise_steps=3", "policy.instruction_len=16"]


def write_folder(root, cfg, seed=0, n_action_steps=None):
    """A tiny SmolVLA for `cfg`'s env in LeRobot's layout, its MEAN_STD normaliser, and a
    SmolVLM2-style tokenizer in a folder of its own."""
    sp = spec(cfg)
    torch.manual_seed(seed)
    model = make_policy(cfg, sp).model
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    smolvla_folder.save_folder(model, root / "smolvla")
    if n_action_steps:
        path = root / "smolvla" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "n_action_steps": n_action_steps}))
    stats = {"observation.state": {"mean": np.full(sp.proprio_dim, 0.5, np.float32), "std": np.full(sp.proprio_dim, 2.0, np.float32)},
             "action": {"mean": np.zeros(sp.action_dim, np.float32), "std": np.full(sp.action_dim, 0.5, np.float32)}}
    norm = Normaliser({"observation.state": "STATE", "action": "ACTION"}, {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"}, stats)
    write_normaliser(root / "smolvla", norm, "policy_preprocessor", index=5)
    write_normaliser(root / "smolvla", norm, "policy_postprocessor", index=0)
    write_tiny_tokenizer(root / "smolvlm2", "smolvlm")
    return model


def pretrained(root):
    return [*SMOLVLA_TOY, f"policy.pretrained={root / 'smolvla'}", f"policy.tokenizer={root / 'smolvlm2'}"]


def test_a_tiny_folder_in_lerobots_layout_loads_back_exactly(tmp_path):
    from safetensors.torch import load_file

    model = write_folder(tmp_path, compose(SMOLVLA_TOY))
    names = {k: v.shape for k, v in load_file(tmp_path / "smolvla" / "model.safetensors").items()}
    expert = "model.vlm_with_expert.lm_expert.layers."
    assert names[expert + "0.self_attn.k_proj.weight"] == (64, 96)    # joint layer: from the expert's 96 wide
    assert names[expert + "1.self_attn.k_proj.weight"] == (64, 64)    # cross layer: from the VLM's K (1 head of 64)
    assert names["model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight"][0] == 128
    assert "model.vlm_with_expert.vlm.lm_head.weight" in names and "model.action_time_mlp_in.weight" in names
    assert not any(n.startswith("model.vlm_with_expert.lm_expert.embed_tokens") for n in names)
    loaded = smolvla_folder.load_folder(tmp_path / "smolvla")
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    c, d = model.config, loaded.config
    assert (d.text.num_attention_heads, d.text.num_key_value_heads, d.vlm.vision_config.num_attention_heads, d.expert_width,
            d.chunk_size, d.vlm.scale_factor) == (2, 1, 2, 96, c.chunk_size, c.vlm.scale_factor)


@pytest.mark.parametrize("damage", ["missing", "extra", "shape"])
def test_a_folder_that_is_not_lerobots_layout_fails_naming_the_tensor(tmp_path, damage):
    write_folder(tmp_path, compose(SMOLVLA_TOY))
    path = tmp_path / "smolvla" / "model.safetensors"
    name = damage_tensor(path, damage, "model.vlm_with_expert.lm_expert.layers.1.self_attn.v_proj.weight",
                         "model.vlm_with_expert.lm_expert.embed_tokens.weight", (64, 96))
    with pytest.raises(LayoutError, match=name.replace(".", r"\.")):
        smolvla_folder.load_folder(tmp_path / "smolvla")


@pytest.mark.parametrize("key, value, says", [("type", "pi0", "type='pi0'"),
                                               ("attention_mode", "self_attn", "attention_mode='self_attn'"),
                                               ("add_image_special_tokens", True, "add_image_special_tokens=True")])
def test_a_folder_of_another_model_or_setting_is_refused_before_any_rank_starts(tmp_path, key, value, says):
    write_folder(tmp_path, compose(SMOLVLA_TOY))
    path = tmp_path / "smolvla" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(ConfigError, match=says):
        validate(compose(pretrained(tmp_path)))


def test_a_folder_without_its_normaliser_or_tokenizer_is_refused_naming_the_file(tmp_path):
    write_folder(tmp_path, compose(SMOLVLA_TOY))
    validate(compose(pretrained(tmp_path)))
    (tmp_path / "smolvla" / "policy_preprocessor.json").unlink()
    with pytest.raises(ConfigError, match="no policy_preprocessor.json"):
        validate(compose(pretrained(tmp_path)))
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        validate(compose([*pretrained(tmp_path), f"policy.tokenizer={tmp_path}"]))


def test_the_prompt_is_the_task_and_a_newline_in_smolvlm2s_tokenizer(tmp_path):
    cfg = compose(SMOLVLA_TOY)
    write_folder(tmp_path, cfg)
    encode = instruction_encoder(compose(pretrained(tmp_path)).policy)
    assert isinstance(encode, SmolVLAPrompt) and not encode.reads_state
    ids = encode("go to the red_square")
    n = int((ids != 0).sum())
    # no cleaning, no BOS (SmolLM2's tokenizer adds none)
    assert list(ids[:n]) == encode.tok.encode("go to the red_square\n").ids
    assert encode.tok.decode(list(ids[:n])) == "go to the red_square\n"
    np.testing.assert_array_equal(encode("lift\n"), encode("lift"))   # a newline already there is not doubled
    write_tiny_tokenizer(tmp_path / "paligemma", "paligemma")
    with pytest.raises(ValueError, match="not SmolVLM2's tokenizer"):
        SmolVLAPrompt(tmp_path / "paligemma", 16)


def test_the_folder_says_how_many_actions_of_a_chunk_to_execute(tmp_path):
    write_folder(tmp_path, compose(SMOLVLA_TOY), n_action_steps=2)
    assert execute_steps(compose(pretrained(tmp_path)).policy) == 2
    assert execute_steps(compose([*pretrained(tmp_path), "policy.execute_steps=1"]).policy) == 1


def test_act_and_evaluate_agree_and_the_state_token_and_time_condition_the_actions(tmp_path):
    cfg = compose(SMOLVLA_TOY)
    write_folder(tmp_path, cfg)
    cfg = compose([*pretrained(tmp_path), "policy.lora_rank=0"])   # full fine-tuning: every weight trains
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    images, proprio, tokens, noise = obs_batch(sp, instruction_encoder(cfg.policy))
    sample, logp, value = policy.act(images, proprio, tokens, noise)
    one = policy.act(images[1:2], proprio[1:2], tokens[1:2], noise[1:2])
    assert torch.allclose(one[0], sample[1:2], atol=1e-5), "a sample depends on its batch"
    lp, _, v = policy.evaluate(images, proprio, tokens, sample)
    assert torch.allclose(lp, logp, atol=1e-4) and torch.allclose(v, value, atol=1e-5)
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    vlm = "model.vlm_with_expert.vlm.model."
    assert {"model.state_proj.weight", "model.action_time_mlp_in.weight",
            "model.vlm_with_expert.lm_expert.layers.1.self_attn.k_proj.weight",
            vlm + "vision_model.encoder.layers.0.mlp.fc1.weight", vlm + "connector.modality_projection.proj.weight",
            "log_std", "value_head.weight"} <= grads
    with torch.no_grad():
        moved = policy.act(images, proprio + 5.0, tokens, noise)[0]
        prefix, _, _ = policy._prefix(images, proprio, tokens)
        x = torch.nn.functional.pad(noise[:, 0], (0, policy.model.config.max_action_dim - sp.action_dim))
        v1, v2 = (policy.model.velocity(prefix, x, torch.full((3,), t)) for t in (0.9, 0.2))
    # one token of ~55 under near-uniform random attention: a small but certain change
    assert (moved - sample).abs().max() > 1e-4, "the proprio does not reach the actions (the state token)"
    assert not torch.allclose(v1, v2, atol=1e-4), "the velocity does not depend on t"


def test_images_and_instruction_never_attend_to_the_state_token(tmp_path):
    """SmolVLA's prefix blocks: images and text see each other, the state token sees them and
    itself. So the state changes no valid image or text token's K/V. (A padding row is allowed
    nothing and averages every key, as LeRobot's: its own K/V move, and no valid token reads them.)"""
    cfg = compose(SMOLVLA_TOY)
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    images, proprio, tokens, _ = obs_batch(sp, instruction_encoder(cfg.policy))
    with torch.no_grad():
        a = policy.model.prefix(images, tokens, policy._state(proprio))
        b = policy.model.prefix(images, tokens, policy._state(proprio + 3.0))
    assert a.valid[:, -1].all() and (a.valid[:, -1 - tokens.shape[1]:-1] == (tokens != 0)).all()
    seen = a.valid.clone()
    seen[:, -1] = False   # the valid image and text tokens
    for i in range(len(a.keys)):
        torch.testing.assert_close(a.keys[i][seen], b.keys[i][seen])
        assert not torch.allclose(a.keys[i][:, -1], b.keys[i][:, -1])


def test_rope_rotates_halves_at_base_10000():
    """LeRobot's SmolVLA RoPE: the first and second halves of each head paired, angle p / 10000^(2i/D)."""
    x = torch.randn(1, 2, 1, 8)
    pos = torch.tensor([[0, 3]])
    out = rope(x, pos)
    torch.testing.assert_close(out[:, 0], x[:, 0])
    i = torch.arange(4)
    angle = 3 / 10000 ** (2 * i / 8)
    a, b = x[0, 1, 0, :4], x[0, 1, 0, 4:]
    torch.testing.assert_close(out[0, 1, 0], torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()]))


def test_the_published_configuration_is_smolvla_bases_500_tensors_and_450_million_parameters():
    """The count of the released lerobot/smolvla_base file (docs/layouts/smolvla-base.md)."""
    model = smolvla_folder.published_smolvla()
    sd = model.state_dict()
    assert all(p.is_meta for p in model.parameters()) and len(sd) == 500
    assert sum(v.numel() for v in sd.values()) == PUBLISHED_PARAMS == 450_046_176
    expert = sum(v.numel() for k, v in sd.items() if k.startswith("vlm_with_expert.lm_expert."))
    assert expert == 98_245_840
    assert sd["vlm_with_expert.lm_expert.layers.15.self_attn.k_proj.weight"].shape == (320, 320)
    assert sd["vlm_with_expert.lm_expert.layers.14.self_attn.k_proj.weight"].shape == (320, 720)
    assert sd["vlm_with_expert.vlm.model.connector.modality_projection.proj.weight"].shape == (960, 12288)
    assert not any(k.startswith("vlm_with_expert.vlm.model.text_model.layers.16.") for k in sd)


@needs_mpi
@pytest.mark.slow
def test_a_pretrained_smolvla_trains_through_the_engine_with_matching_logprobs(tmp_path):
    write_folder(tmp_path, compose(SMOLVLA_TOY))
    over = [*pretrained(tmp_path), *LOGP_CHECK, "policy.lora_base_dtype=float32"]
    run_logprob_check(tmp_path, over, "pretrained smolvla")
