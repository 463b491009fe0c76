"""policy=gr00t (GR00T N1.5) from its released folder layout (a tiny copy: same file names,
config keys, tensor names and metadata.json, SigLIP So400m's head size, random weights): it
loads back exactly, tensors a save may add and the forward never reads are dropped, a differing
folder fails naming the tensor or file; the prompt is Eagle's chat template split exactly where
the model takes over; the flow runs in GR00T's direction; act and evaluate agree; it trains
through the engine with the Generator's and Trainer's log-probs equal; its published
configuration has GR00T N1.5-3B's components."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError
from rlvla3.policies import make_policy
from rlvla3.policies.base import LayoutError
from rlvla3.policies.gr00t import folder as gr00t_folder
from rlvla3.policies.gr00t import layout
from rlvla3.policies.prompts import instruction_encoder, load_tokenizer, write_tiny_tokenizer
from rlvla3.world import spec, validate
from tests.conftest import LOGP_CHECK, TOY, damage_tensor, needs_mpi, obs_batch, run_logprob_check

# SigLIP So400m's head size (72) so the vision head count read off the tensors is the one built.
GR00T_TOY = [*TOY, "policy=gr00t", "policy.d_model=72", "policy.heads=1", "policy.layers=1", "policy.patch=7",
             "policy.chunk=3", "policy.denoise_steps=3", "policy.instruction_len=24"]


def write_folder(root, cfg, tag="new_embodiment", seed=0):
    """A tiny GR00T N1.5 for `cfg`'s env in the released layout, its metadata.json (the env's
    state and actions as subkeys, the last action dim a `gripper`), and an Eagle-style tokenizer."""
    sp = spec(cfg)
    torch.manual_seed(seed)
    model = make_policy(cfg, sp).model
    for p in model.parameters():
        p.data.normal_(0, 0.05)
    sub = lambda n, lo, hi: {f"d{i}": {"min": [lo], "max": [hi]} for i in range(n)}  # noqa: E731
    action = {**sub(sp.action_dim - 1, -0.5, 0.5), "gripper": {"min": [0.0], "max": [1.0]}}
    meta = {tag: {"statistics": {"state": sub(sp.proprio_dim, -2.0, 2.0), "action": action}, "embodiment_tag": tag}}
    gr00t_folder.save_folder(model, root / "gr00t", meta)
    write_tiny_tokenizer(root / "eagle", "eagle")
    return model


def pretrained(root):
    return [*GR00T_TOY, f"policy.pretrained={root / 'gr00t'}", f"policy.tokenizer={root / 'eagle'}"]


def test_a_tiny_folder_in_the_released_layout_loads_back_exactly(tmp_path):
    from safetensors.torch import load_file, save_file

    model = write_folder(tmp_path, compose(GR00T_TOY))
    path = tmp_path / "gr00t" / "model.safetensors"
    t = load_file(path)
    assert t["action_head.model.transformer_blocks.0.attn1.to_k.weight"].shape == (36, 72)   # cross: from the VL width
    assert t["action_head.model.transformer_blocks.1.attn1.to_k.weight"].shape == (36, 36)   # self
    assert t["action_head.state_encoder.layer1.W"].shape[0] == 32                                   # the embodiment bank
    assert "backbone.eagle_model.vision_model.vision_model.encoder.layers.0.mlp.fc1.weight" in t
    assert "backbone.eagle_model.language_model.model.layers.0.self_attn.q_norm.weight" in t
    # what some saves add and the forward never reads: dropped by name
    t["backbone.eagle_model.language_model.lm_head.weight"] = torch.zeros(3)
    t["backbone.eagle_model.vision_model.vision_model.head.probe"] = torch.zeros(1, 1, 72)
    save_file(t, path, metadata={"format": "pt"})
    loaded = gr00t_folder.load_folder(tmp_path / "gr00t", 31)
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    c, d = model.config, loaded.config
    assert (d.text["head_dim"], d.vision["num_attention_heads"], d.dit_layers, d.future_tokens, d.embodiment) == \
        (72, 1, c.dit_layers, c.future_tokens, 31)


@pytest.mark.parametrize("damage", ["missing", "extra", "shape"])
def test_a_folder_that_is_not_the_released_layout_fails_naming_the_tensor(tmp_path, damage):
    write_folder(tmp_path, compose(GR00T_TOY))
    path = tmp_path / "gr00t" / "model.safetensors"
    name = damage_tensor(path, damage, "action_head.model.transformer_blocks.1.attn1.to_k.weight",
                         "action_head.model.transformer_blocks.1.norm3.weight", (36, 3))
    with pytest.raises(LayoutError, match=name.replace(".", r"\.")):
        gr00t_folder.load_folder(tmp_path / "gr00t", 31)


def test_a_folder_of_another_model_or_embodiment_is_refused_before_any_rank_starts(tmp_path):
    write_folder(tmp_path, compose(GR00T_TOY))
    validate(compose(pretrained(tmp_path)))
    meta = tmp_path / "gr00t" / "experiment_cfg" / "metadata.json"
    entry = json.loads(meta.read_text())["new_embodiment"]
    meta.write_text(json.dumps({"new_embodiment": entry, "gr1": entry}))
    with pytest.raises(ConfigError, match="holds 2 embodiments"):
        validate(compose(pretrained(tmp_path)))
    entry["statistics"]["state"]["extra"] = {"min": [0.0], "max": [1.0]}
    meta.write_text(json.dumps({"new_embodiment": entry}))
    with pytest.raises(ConfigError, match="the state statistics .* have 3 dims; this run's state has 2"):
        validate(compose(pretrained(tmp_path)))
    path = tmp_path / "gr00t" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_type": "gr00t_n1"}))
    with pytest.raises(ConfigError, match="model_type='gr00t_n1'"):
        validate(compose(pretrained(tmp_path)))


def test_the_prompt_is_eagles_chat_template_split_where_the_model_takes_over(tmp_path):
    cfg = compose(GR00T_TOY)
    write_folder(tmp_path, cfg)
    cfg = compose(pretrained(tmp_path))
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    encode = instruction_encoder(cfg.policy)
    ids = encode("pick up the black bowl")
    n = int((ids != 0).sum())
    whole = [*policy.template.tolist(), *ids[:n]]
    tok = load_tokenizer(tmp_path / "eagle")
    per_image = policy.model.config.tokens_per_image
    text = (layout.SYSTEM + "<image 1><img>" + layout.IMAGE_TOKEN * per_image + "</img>pick up the black bowl" + layout.TAIL)
    assert whole == tok.encode(text, add_special_tokens=False).ids
    assert whole.count(tok.token_to_id(layout.IMAGE_TOKEN)) == per_image * sp.cameras


def test_act_and_evaluate_agree_and_the_flow_runs_from_noise_to_actions(tmp_path):
    cfg = compose(GR00T_TOY)
    write_folder(tmp_path, cfg)
    cfg = compose([*pretrained(tmp_path), "policy.lora_rank=0"])
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
    assert {"model.action_head.state_encoder.layer1.W", "model.action_head.future_tokens.weight",
            "model.action_head.model.transformer_blocks.0.attn1.to_k.weight", "model.backbone.eagle_model.mlp1.0.weight",
            "log_std", "value_head.weight"} <= grads
    with torch.no_grad():   # the first step reads t = 0 (noise), as GR00T's inference starts
        f, mask, _ = policy._prefix(images, proprio, tokens)
        x = noise[:, 0] * policy.start_std
        xp = torch.nn.functional.pad(x, (0, policy.model.config.max_action_dim - sp.action_dim))
        u = policy.direction(f, mask, None, x, 0)   # flow_rl's dx/dtau: -GR00T's velocity
        v0 = policy.model.velocity(f, xp, torch.zeros(3))[..., :sp.action_dim]
    torch.testing.assert_close(x - u / policy.steps, x + v0 / policy.steps)


def test_the_gripper_maps_as_gr00ts_libero_client_and_back(tmp_path):
    cfg = compose(GR00T_TOY)
    write_folder(tmp_path, cfg)
    sp = spec(compose(pretrained(tmp_path)))
    policy = make_policy(compose(pretrained(tmp_path)), sp)
    assert policy.gripper == [sp.action_dim - 1]
    env = np.array([[[0.25, 1.0], [0.0, -1.0], [-0.25, 1.0]]], np.float32)   # [n, K, D]: closed, open, closed
    sample = policy.expert_sample(sp.sample, env, 0)
    assert sample.shape[1:] == (policy.steps + 1, 3, 2)
    np.testing.assert_allclose(policy.to_env_action(sample), env, atol=1e-6)
    # GR00T's data holds 1 open, 0 closed; its client sends sign(1 - 2x)
    x = np.zeros((1, policy.steps + 1, 3, 2), np.float32)
    scale, shift = policy.action_affine
    x[:, -1, :, 1] = np.array([0.9, 0.1, 0.5]) * scale[1] + shift[1]
    np.testing.assert_array_equal(policy.to_env_action(x)[0, :, 1], [-1.0, 1.0, 0.0])


def test_the_published_configuration_is_gr00t_n15s_components():
    """SigLIP So400m 412,442,352 + mlp1 2,361,344 + Qwen3's first 12 layers 914,674,688 + the
    action head 1,068,806,144 (the released config.json's sizes; docs/layouts/gr00t-n1.5.md)."""
    model = gr00t_folder.published_gr00t()
    sd = model.state_dict()
    assert all(p.is_meta for p in model.parameters())
    part = lambda prefix: sum(v.numel() for k, v in sd.items() if k.startswith(prefix))  # noqa: E731
    assert part("backbone.eagle_model.vision_model.") == 412_442_352
    assert part("backbone.eagle_model.mlp1.") == 2_361_344
    assert part("backbone.eagle_model.language_model.") == 914_674_688
    assert part("action_head.") == 1_068_806_144
    assert sd["action_head.action_encoder.W2.W"].shape == (32, 3072, 1536)
    assert sd["action_head.model.transformer_blocks.14.attn1.to_k.weight"].shape == (1536, 2048)
    assert sd["action_head.model.transformer_blocks.15.attn1.to_k.weight"].shape == (1536, 1536)
    assert not any(k.startswith("backbone.eagle_model.language_model.model.layers.12.") for k in sd)


@needs_mpi
@pytest.mark.slow
def test_a_pretrained_gr00t_trains_through_the_engine_with_matching_logprobs(tmp_path):
    write_folder(tmp_path, compose(GR00T_TOY))
    over = [*pretrained(tmp_path), *LOGP_CHECK, "policy.lora_base_dtype=float32"]
    run_logprob_check(tmp_path, over, "pretrained gr00t")
