"""policy=pi05 (π0.5) from LeRobot's folder layout (a tiny copy: same file names, config keys
and tensor names, random weights): it loads back exactly and a differing folder fails naming the
tensor; the Simulator writes the normalised, binned state into the prompt; the adaRMS expert is
conditioned on time; act and evaluate agree; it trains through the engine with the Generator's and
Trainer's log-probs equal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError
from rlvla3.policies import make_policy
from rlvla3.policies.base import LayoutError
from rlvla3.policies.pi import pi05
from rlvla3.policies.pi.layout import (
    WORD_MARK,
    HashedPi05Prompt,
    Normaliser,
    Pi0Prompt,
    Pi05Prompt,
    hashed_pi05_min_length,
    pi05_text,
    pi05_words,
    write_normaliser,
)
from rlvla3.policies.prompts import hashed_words, instruction_encoder, write_tiny_tokenizer
from rlvla3.world import derive, spec, validate
from tests.conftest import LOGP_CHECK, TOY, damage_tensor, needs_mpi, run_logprob_check

PI05_TOY = [*TOY, "policy=pi05", "policy.patch=3", "policy.chunk=2", "policy.denoise_steps=3", "policy.instruction_len=48"]


def write_folder(root, cfg, seed=0, state_statistics=True):
    """A tiny π0.5 for `cfg`'s env in LeRobot's layout, its QUANTILES normaliser (without the
    state's statistics: as a base checkpoint fine-tuned on actions alone), and a PaliGemma-style
    tokenizer in a folder of its own."""
    sp = spec(cfg)
    torch.manual_seed(seed)
    model = make_policy(compose([o for o in PI05_TOY]), sp).model
    for p in model.parameters():   # non-zero everywhere (adaRMS dense starts at zero otherwise)
        p.data.normal_(0, 0.1)
    pi05.save_folder(model, root / "pi05")
    stats = {"observation.state": {"q01": np.full(sp.proprio_dim, -2.0, np.float32), "q99": np.full(sp.proprio_dim, 2.0, np.float32)},
             "action": {"q01": np.full(sp.action_dim, -1.0, np.float32), "q99": np.full(sp.action_dim, 1.0, np.float32)}}
    if not state_statistics:
        del stats["observation.state"]
    norm = Normaliser({"observation.state": "STATE", "action": "ACTION"}, {"STATE": "QUANTILES", "ACTION": "QUANTILES"}, stats)
    write_normaliser(root / "pi05", norm, "policy_preprocessor")
    write_normaliser(root / "pi05", norm, "policy_postprocessor")
    write_tiny_tokenizer(root / "paligemma", "paligemma")
    return model


def pretrained(root):
    return [*PI05_TOY, f"policy.pretrained={root / 'pi05'}", f"policy.tokenizer={root / 'paligemma'}"]


def test_a_tiny_folder_in_lerobots_layout_loads_back_exactly(tmp_path):
    from safetensors.torch import load_file

    model = write_folder(tmp_path, compose(PI05_TOY))
    names = load_file(tmp_path / "pi05" / "model.safetensors")
    assert "paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight" in names
    assert "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight" in names
    assert "time_mlp_out.bias" in names and not any("embed_tokens" in n for n in names)
    loaded = pi05.load_folder(tmp_path / "pi05")
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    c, d = model.config, loaded.config
    assert (d.chunk_size, d.max_action_dim, d.dit_config.num_attention_heads, d.vlm_config.vision_config.image_size) == \
        (c.chunk_size, c.max_action_dim, c.dit_config.num_attention_heads, c.vlm_config.vision_config.image_size)


@pytest.mark.parametrize("damage", ["missing", "extra", "shape"])
def test_a_folder_that_is_not_lerobots_layout_fails_naming_the_tensor(tmp_path, damage):
    write_folder(tmp_path, compose(PI05_TOY))
    path = tmp_path / "pi05" / "model.safetensors"
    name = damage_tensor(path, damage, "paligemma_with_expert.gemma_expert.model.layers.1.post_attention_layernorm.dense.weight",
                         "paligemma_with_expert.gemma_expert.model.layers.1.post_attention_layernorm.weight", (3, 3))
    with pytest.raises(LayoutError, match=name.replace(".", r"\.")):
        pi05.load_folder(tmp_path / "pi05")


def test_the_prompt_carries_the_normalised_binned_state_and_is_encoded_each_step(tmp_path):
    cfg = compose(PI05_TOY)
    write_folder(tmp_path, cfg)
    cfg = compose(pretrained(tmp_path))
    validate(cfg)
    encode = Pi05Prompt(tmp_path / "paligemma", 48, tmp_path / "pi05")
    assert encode.reads_state
    state = np.array([-2.0, 0.0, 1.99, 5.0][:spec(cfg).proprio_dim], np.float32)
    bins = np.digitize(state / 2.0, np.linspace(-1, 1, 257)[:-1]) - 1     # q01/q99 = -2/2
    want = f"Task: go to the red square, State: {' '.join(map(str, bins))};\nAction: "
    ids = encode("go to the red_square ", state)
    n = int((ids != 0).sum())
    assert list(ids[:n]) == [2, *encode.text_ids(want)]
    assert bins[0] == 0   # -1 is bin 0
    # Outside [-1, 1]: bin -1 below, 255 from the last edge up (openpi's digitize; no bin 256)
    assert pi05_text("t", np.array([-1.5, -1.0, 0.999, 1.0, 7.0], np.float32)) == "Task: t, State: -1 0 255 255 255;\nAction: "
    assert not np.array_equal(encode("go to the red square", state + 0.5), ids)
    with pytest.raises(ConfigError, match=r"no 'q01' statistics for 'observation.state' \(a base checkpoint carries none"):
        write_normaliser(tmp_path / "pi05", Normaliser({"observation.state": "STATE"}, {"STATE": "QUANTILES"}), "policy_preprocessor")
        validate(cfg)


def test_a_random_initialised_pi05_reads_the_raw_binned_state_in_its_prompt():
    """No folder, no tokenizer, no statistics: π0.5's prompt text as hashed words, the raw proprio
    binned, so the state still reaches a model that has no state token."""
    cfg = compose(PI05_TOY)
    encode = instruction_encoder(cfg.policy)
    assert isinstance(encode, HashedPi05Prompt) and encode.reads_state
    state = np.array([-1.0, 0.0, 0.25, 3.0][:spec(cfg).proprio_dim], np.float32)
    bins = np.digitize(state, np.linspace(-1, 1, 257)[:-1]) - 1
    text = f"Task: go to the red square, State: {' '.join(map(str, bins))};\nAction: "
    words = pi05_words(text)
    assert words[words.index("State:") + 1:][:6] == [WORD_MARK, "0", WORD_MARK, "1", "2", "8"]   # bins 0 and 128
    ids = encode("go to the red_square ", state)
    np.testing.assert_array_equal(ids, hashed_words(" ".join(words), cfg.policy.instruction_len, cfg.policy.vocab))
    # A state a bin away changes one digit's word, and that word is one the other values use too:
    # a random-initialised π0.5 reads a bin no demonstration reached with trained embeddings.
    moved = state.copy()
    moved[1] += 0.01   # bin 128 -> 129
    changed = np.flatnonzero(encode("go to the red square", moved) != ids)
    assert len(changed) == 1 and changed[0] == words.index("State:") + 6
    assert encode("go to the red square", moved)[changed[0]] in set(hashed_words("0 1 2 3 4 5 6 7 8 9", 11, cfg.policy.vocab))
    # Without a state (SFT's --state-dropout), the task alone.
    np.testing.assert_array_equal(encode("go to the red square", None),
                                  hashed_words("Task: go to the red square;\nAction: ", cfg.policy.instruction_len, cfg.policy.vocab))
    with pytest.raises(ValueError, match=r"policy.instruction_len=8 cuts π0.5's prompt of \d+ words"):
        HashedPi05Prompt(8, cfg.policy.vocab)("go to the red square", state)
    # The run's config is refused before any rank starts when even a one-word task cannot fit;
    # the bound is exact: a one-word task fills the shortest allowed prompt.
    need = hashed_pi05_min_length(spec(cfg).proprio_dim)
    longest = np.full_like(state, 0.5)   # bin 192 in every value: 3 digits each
    HashedPi05Prompt(need, cfg.policy.vocab)("lift", longest)
    with pytest.raises(ValueError, match="cuts"):
        HashedPi05Prompt(need - 1, cfg.policy.vocab)("lift", longest)
    derive(compose([*PI05_TOY, f"policy.instruction_len={need}"]))
    with pytest.raises(ConfigError, match=rf"policy\.instruction_len={need - 1}: .* give at least {need}"):
        derive(compose([*PI05_TOY, f"policy.instruction_len={need - 1}"]))


@pytest.mark.parametrize("folder", [False, True])
def test_without_discrete_state_input_the_prompt_is_the_task_alone(tmp_path, folder):
    """policy.discrete_state_input=false (openpi's name): π0.5 sees no state; its prompt is the
    task alone whatever the proprio, encoded once per instruction, and the instruction_len bound
    that holds a state no longer applies."""
    if folder:
        write_folder(tmp_path, compose(PI05_TOY))
    base = pretrained(tmp_path) if folder else PI05_TOY
    proprio_dim = spec(compose(base)).proprio_dim
    with_state = instruction_encoder(compose(base).policy)
    encode = instruction_encoder(compose([*base, "policy.discrete_state_input=false"]).policy)
    assert with_state.reads_state and not getattr(encode, "reads_state", False)
    np.testing.assert_array_equal(encode("go to the red square"), with_state("go to the red square", None))
    state = np.zeros(proprio_dim, np.float32)
    assert not np.array_equal(encode("go to the red square"), with_state("go to the red square", state))
    need = hashed_pi05_min_length(proprio_dim)
    derive(compose([*PI05_TOY, "policy.discrete_state_input=false", f"policy.instruction_len={need - 1}"]))
    if folder:   # a released π0.5 without its state is prompted as openpi does: π0's BOS, task, "\n"
        pi0 = Pi0Prompt(tmp_path / "paligemma", compose(base).policy.instruction_len)
        np.testing.assert_array_equal(encode("go to the red_square "), pi0("go to the red square"))
        n = int((pi0("go to the red square") != 0).sum())
        assert list(pi0("go to the red square")[:n]) == [2, *pi0.text_ids("go to the red square"), *pi0.text_ids("\n")]


def test_a_checkpoint_without_state_statistics_loads_when_the_prompt_holds_no_state(tmp_path):
    """A folder with no statistics for observation.state is refused while π0.5 writes the state
    into its prompt (naming them), and loads and acts with policy.discrete_state_input=false:
    nothing then reads them (π0.5 has no state token)."""
    write_folder(tmp_path, compose(PI05_TOY), state_statistics=False)
    with pytest.raises(ConfigError, match=r"no 'q01' statistics for 'observation.state'"):
        validate(compose(pretrained(tmp_path)))
    cfg = compose([*pretrained(tmp_path), "policy.discrete_state_input=false"])
    validate(cfg)
    sp = spec(cfg)
    encode = instruction_encoder(cfg.policy)
    tokens = torch.from_numpy(np.stack([encode("go to the red square")] * 2))
    policy = make_policy(cfg, sp)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (2, sp.cameras, sp.image_size, sp.image_size, 3), generator=g, dtype=torch.uint8)
    noise = torch.randn(2, *sp.sample.noise_shape, generator=g)
    far_apart = torch.stack([torch.zeros(sp.proprio_dim), torch.full((sp.proprio_dim,), 50.0)])
    sample, logp, _ = policy.act(images[:1].expand(2, -1, -1, -1, -1), far_apart, tokens, noise[:1].expand(2, -1, -1, -1))
    assert torch.isfinite(logp).all()
    torch.testing.assert_close(sample[0], sample[1])   # the proprio reaches the model nowhere
    with pytest.raises(ValueError, match="without the checkpoint's state statistics"):
        Pi05Prompt(tmp_path / "paligemma", 48, None)("go to the red square", np.zeros(sp.proprio_dim, np.float32))


def test_act_and_evaluate_agree_and_the_expert_is_conditioned_on_time(tmp_path):
    cfg = compose(PI05_TOY)
    write_folder(tmp_path, cfg)
    cfg = compose([*pretrained(tmp_path), "policy.lora_rank=0"])   # full fine-tuning: every weight trains
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    encode = Pi05Prompt(tmp_path / "paligemma", 48, tmp_path / "pi05")
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (3, sp.cameras, sp.image_size, sp.image_size, 3), generator=g, dtype=torch.uint8)
    proprio = torch.randn(3, sp.proprio_dim, generator=g)
    tokens = torch.from_numpy(np.stack([encode(t, p.numpy()) for t, p in zip(("a", "go to the red square", "lift"), proprio)]))
    noise = torch.randn(3, *sp.sample.noise_shape, generator=g)
    sample, logp, value = policy.act(images, proprio, tokens, noise)
    one = policy.act(images[1:2], proprio[1:2], tokens[1:2], noise[1:2])
    assert torch.allclose(one[0], sample[1:2], atol=1e-5), "a sample depends on its batch"
    lp, ent, v = policy.evaluate(images, proprio, tokens, sample)
    assert torch.allclose(lp, logp, atol=1e-4) and torch.allclose(v, value, atol=1e-5)
    (lp.sum() + v.sum()).backward()
    grads = {n for n, p in policy.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert {"model.time_mlp_in.weight", "model.model.dit.layers.0.input_layernorm.dense.weight",
            "model.model.vlm.language_model.layers.0.mlp.up_proj.weight", "log_std", "value_head.weight"} <= grads
    with torch.no_grad():
        cache, mask, _ = policy._prefix(images, proprio, tokens)
        x = noise[:, 0]
        x = torch.nn.functional.pad(x, (0, policy.model.config.max_action_dim - sp.action_dim))
        length = cache.get_seq_length()
        v1 = policy.model.velocity(cache, mask, x, torch.full((3,), 0.9))
        cache.crop(length - cache.get_seq_length())
        v2 = policy.model.velocity(cache, mask, x, torch.full((3,), 0.2))
    assert not torch.allclose(v1, v2, atol=1e-4), "the velocity does not depend on t: the adaRMS condition is not used"


def test_a_chain_started_at_the_origin_varies_only_by_the_noise_that_log_pi_credits():
    """policy.flow_start_std=0: x_0 is the origin, so what varies between two samples of one
    observation is the noise injected at the denoising steps, the part of a sample log pi
    credits; with the flow's own start (1) x_0 moves the chunk far more than that noise does."""
    spread = {}
    for start in (1.0, 0.0):
        cfg = compose([*PI05_TOY, "policy.flow_noise_std=0.01", f"policy.flow_start_std={start}"])
        sp = spec(cfg)
        policy = make_policy(cfg, sp)
        g = torch.Generator().manual_seed(0)
        n = 16   # one observation, 16 draws of the noise
        images = torch.randint(0, 255, (1, sp.cameras, sp.image_size, sp.image_size, 3), generator=g,
                               dtype=torch.uint8).expand(n, -1, -1, -1, -1)
        proprio = torch.randn(1, sp.proprio_dim, generator=g).expand(n, -1)
        tokens = torch.from_numpy(instruction_encoder(cfg.policy)("lift", proprio[0].numpy())).expand(n, -1)
        noise = torch.randn(n, *sp.sample.noise_shape, generator=g)
        with torch.no_grad():
            sample, logp, _ = policy.act(images, proprio, tokens, noise)
            lp, _, _ = policy.evaluate(images, proprio, tokens, sample)
        assert torch.allclose(lp, logp, atol=1e-3), "evaluate does not recompute act's log-prob of the chain"
        assert torch.equal(sample[:, 0], noise[:, 0] * start), "the chain does not keep the start it denoised from"
        spread[start] = sample[:, -1].std(0).mean().item()
    assert spread[0.0] < 0.1 * spread[1.0], f"chunk spread over draws: {spread}"


@needs_mpi
@pytest.mark.slow
def test_a_pretrained_pi05_trains_through_the_engine_with_matching_logprobs(tmp_path):
    """algo.ratio=token: the Trainer's π_prox per action coordinate (a row's K*D log-probs of its
    S denoising transitions), summed, must match the Generator's log-prob of the whole chain.
    (Sequence ratios through the engine: tests/policies/test_flow_rl.py's π0.5 run, and the
    libero_pi05 preset.)"""
    write_folder(tmp_path, compose(PI05_TOY))
    # The default LoRA, over a float32 base (bfloat16 matmuls are slow on CPUs; the OFT engine test runs that).
    over = [*pretrained(tmp_path), *LOGP_CHECK, "policy.lora_base_dtype=float32", "algo.ratio=token"]
    run_logprob_check(tmp_path, over, "pretrained pi05, token ratios")
