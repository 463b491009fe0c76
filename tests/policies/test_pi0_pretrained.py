"""policy=pi0 from a pretrained folder with LeRobot's normaliser files and PaliGemma-style
tokenizer: the Simulator encodes openpi's prompt, the proprio is normalised and the executed chunk
un-normalised with the folder's statistics, a folder without a tokenizer or without its
normaliser is refused before any rank starts, and it trains through the engine with the Generator's and Trainer's log-probs equal."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError
from rlvla3.engine import shards
from rlvla3.policies import make_policy
from rlvla3.policies.pi.layout import Normaliser, Pi0Prompt, write_normaliser
from rlvla3.policies.prompts import write_tiny_tokenizer
from rlvla3.world import spec, validate
from tests.conftest import LOGP_CHECK, TOY, needs_mpi, run_logprob_check

PI0_TOY = [*TOY, "policy=pi0", "policy.patch=3", "policy.chunk=2", "policy.denoise_steps=3"]


def write_folder(root, cfg):
    """A tiny PI0 for `cfg`'s env, with MEAN_STD statistics of its state and actions and a
    PaliGemma-style tokenizer in a folder of its own (LeRobot's π0 folders ship none)."""
    sp = spec(cfg)
    make_policy(cfg, sp).model.save_pretrained(root / "pi0")
    rng = np.random.default_rng(0)
    stats = {"observation.state": {"mean": rng.normal(size=sp.proprio_dim).astype(np.float32),
                                   "std": rng.uniform(0.5, 2, sp.proprio_dim).astype(np.float32)},
             "action": {"mean": np.full(sp.action_dim, 0.1, np.float32), "std": np.full(sp.action_dim, 0.5, np.float32)}}
    norm = Normaliser({"observation.state": "STATE", "action": "ACTION"}, {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"}, stats)
    write_normaliser(root / "pi0", norm, "policy_preprocessor")
    write_normaliser(root / "pi0", norm, "policy_postprocessor")
    write_tiny_tokenizer(root / "paligemma", "paligemma")
    return stats


def test_prompt_state_and_actions_follow_the_folder(tmp_path):
    cfg = compose(PI0_TOY)
    stats = write_folder(tmp_path, cfg)
    over = [*PI0_TOY, f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"]
    cfg = compose(over)
    validate(cfg)
    encode = Pi0Prompt(tmp_path / "paligemma", cfg.policy.instruction_len)
    ids = encode("go to the red_square")
    newline = encode.text_ids("\n")
    n = int((ids != 0).sum())
    assert ids[0] == 2 and list(ids[n - len(newline):n]) == newline and (ids[n:] == 0).all()
    assert list(ids[:n]) == [2, *encode.text_ids("go to the red square"), *newline]   # "_" -> " ", as openpi
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    proprio = torch.randn(3, sp.proprio_dim)
    s = stats["observation.state"]
    want = (proprio - torch.from_numpy(s["mean"])) / (torch.from_numpy(s["std"]) + 1e-8)
    state = policy._state(proprio)
    assert torch.allclose(state[:, :sp.proprio_dim], want, atol=1e-5) and (state[:, sp.proprio_dim:] == 0).all()
    chain = np.random.default_rng(1).normal(size=(3, *sp.sample.shape)).astype(np.float32)
    np.testing.assert_allclose(policy.to_env_action(chain), np.clip(chain[:, -1] * (0.5 + 1e-8) + 0.1, -1, 1), atol=1e-6)
    with pytest.raises(ConfigError, match=r"policy=pi0 policy.pretrained=.*no tokenizer.json in .*pi0"):
        validate(compose(over[:-1]))


# transformers' PI0 names -> LeRobot's (lerobot/pi0: the VLM's lm_head holds the input embedding,
# SigLIP under vision_model, the robot heads at the top; LeRobot's loader may add "model.")
LEROBOT = [("model.vlm.vision_tower.", "paligemma_with_expert.paligemma.model.vision_tower.vision_model."),
           ("model.vlm.language_model.embed_tokens.", "paligemma_with_expert.paligemma.lm_head."),
           ("model.dit.embed_tokens.", "paligemma_with_expert.gemma_expert.lm_head."),
           ("model.vlm.", "paligemma_with_expert.paligemma.model."),
           ("model.dit.", "paligemma_with_expert.gemma_expert.model."), ("embed_action_time.", "")]


def lerobot_name(name: str) -> str:
    return next((theirs + name[len(ours):] for ours, theirs in LEROBOT if name.startswith(ours)), name)


@pytest.mark.parametrize("prefix", ["", "model."])
def test_lerobots_tensor_names_load_exactly(tmp_path, prefix):
    from safetensors.torch import save_file

    cfg = compose(PI0_TOY)
    model = make_policy(cfg, spec(cfg)).model
    model.save_pretrained(tmp_path)
    names = {prefix + lerobot_name(k): v.contiguous() for k, v in model.state_dict().items()}
    assert f"{prefix}paligemma_with_expert.paligemma.lm_head.weight" in names and f"{prefix}state_proj.weight" in names
    save_file(names, tmp_path / "model.safetensors", metadata={"format": "pt"})
    # LeRobot's folder carries its normaliser (identity here: the test is about the tensors)
    write_normaliser(tmp_path, Normaliser({"observation.state": "STATE", "action": "ACTION"},
                                          {"STATE": "IDENTITY", "ACTION": "IDENTITY"}), "policy_preprocessor")
    loaded = make_policy(compose([*PI0_TOY, f"policy.pretrained={tmp_path}", "policy.init_seed=7", "policy.lora_rank=0"]),
                         spec(cfg)).model
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_sft_targets_are_the_actions_in_the_folders_normalised_units(tmp_path):
    write_folder(tmp_path, compose(PI0_TOY))
    cfg = compose([*PI0_TOY, f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"])
    sp = spec(cfg)
    policy = make_policy(cfg, sp)
    a = np.random.default_rng(0).uniform(-1, 1, (3, *sp.sample.shape[1:])).astype(np.float32)
    chain = policy.expert_sample(sp.sample, a, 0)
    np.testing.assert_allclose(chain[:, -1], (a - 0.1) / 0.5, rtol=1e-6)   # action mean 0.1, std 0.5
    np.testing.assert_allclose(policy.to_env_action(chain), a, atol=1e-6)


def test_a_folder_without_its_normaliser_is_refused_before_any_rank_starts(tmp_path):
    """openpi's PyTorch converter and RLinf write π0 folders with the same tensor names and no
    LeRobot processor files: read as identity normalisation, a raw state would enter the model
    and normalised actions would be executed. The run is refused, naming the missing file."""
    cfg = compose(PI0_TOY)
    write_folder(tmp_path, cfg)
    over = [*PI0_TOY, f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"]
    validate(compose(over))
    for name in ("policy_preprocessor.json", "policy_postprocessor.json"):
        (tmp_path / "pi0" / name).unlink()
    with pytest.raises(ConfigError, match=r"policy=pi0 policy.pretrained=.*has no policy_preprocessor.json"):
        validate(compose(over))
    with pytest.raises(FileNotFoundError, match="policy_preprocessor.json"):
        make_policy(compose(over), spec(cfg))


def test_a_folder_of_another_model_is_refused_naming_its_type(tmp_path):
    """transformers' PI0Config takes any config.json and ignores what it does not know: a π0.5
    folder given as policy=pi0 (or the reverse) is refused by its config's type first."""
    cfg = compose(PI0_TOY)
    write_folder(tmp_path, cfg)
    over = [*PI0_TOY, f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"]
    validate(compose(over))   # transformers' config.json: model_type pi0
    with pytest.raises(ConfigError, match=r"policy=pi05 policy.pretrained=.*says type='pi0'.*policy=pi05 loads a pi05 folder"):
        validate(compose([*over, "policy=pi05", "policy.instruction_len=48"]))
    (tmp_path / "pi0" / "config.json").write_text('{"type": "pi05"}')
    with pytest.raises(ConfigError, match=r"says type='pi05'.*policy=pi0 loads a pi0 folder"):
        validate(compose(over))


def test_the_execution_horizon_is_read_from_the_folder_and_bounded_by_the_chunk(tmp_path):
    """LeRobot's config.json says how many actions of a chunk its evaluation executes
    (n_action_steps): with policy.execute_steps=0 the Simulators execute that many (the world
    says it), a set policy.execute_steps wins, and more than the chunk is refused before any rank
    starts, naming the folder's value."""
    import json

    from rlvla3.world import derive

    cfg = compose([*PI0_TOY, "policy.chunk=4"])
    write_folder(tmp_path, cfg)
    over = [*PI0_TOY, "policy.chunk=4", f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"]
    assert derive(compose(over)).execute_steps == 4   # transformers' config.json: no n_action_steps, the whole chunk
    config = tmp_path / "pi0" / "config.json"
    written = json.loads(config.read_text())
    config.write_text(json.dumps({**written, "n_action_steps": 3}))
    assert derive(compose(over)).execute_steps == 3
    assert derive(compose([*over, "policy.execute_steps=2"])).execute_steps == 2
    config.write_text(json.dumps({**written, "n_action_steps": 10}))
    with pytest.raises(ConfigError, match=r"n_action_steps=10, more than policy.chunk=4"):
        validate(compose(over))
    with pytest.raises(ConfigError, match=r"policy.execute_steps=5.*1 to policy.chunk=4"):
        validate(compose([*over, "policy.execute_steps=5"]))


def test_statistics_of_another_robot_are_named(tmp_path):
    cfg = compose(PI0_TOY)
    write_folder(tmp_path, cfg)
    norm = Normaliser({"observation.state": "STATE", "action": "ACTION"}, {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
                      {"observation.state": {"mean": np.zeros(9, np.float32), "std": np.ones(9, np.float32)}})
    write_normaliser(tmp_path / "pi0", norm, "policy_preprocessor")
    over = [*PI0_TOY, f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"]
    with pytest.raises(ValueError, match=r"'observation.state' statistics have shape \(9,\); this run's observation.state has"):
        make_policy(compose(over), spec(cfg))


@needs_mpi
@pytest.mark.slow
def test_a_pretrained_pi0_trains_through_the_engine_with_matching_logprobs(tmp_path):
    write_folder(tmp_path, compose(PI0_TOY))
    over = [*PI0_TOY, *LOGP_CHECK, "policy.lora_rank=0",   # full fine-tuning (LoRA: the OFT and π0.5 engine tests)
            f"policy.pretrained={tmp_path / 'pi0'}", f"policy.tokenizer={tmp_path / 'paligemma'}"]
    run = run_logprob_check(tmp_path, over, "pretrained pi0")
    # The shard keeps the chain x_0..x_3; the executed chunk is x_3 un-normalised (action mean 0.1, std 0.5).
    a, _ = shards.read_shard(run / "shards" / shards.scan(run / "shards")[0])
    T, N = a["rewards"].shape
    assert a["sample"].shape == (T, N, 4, 2, 2) and a["sample"].dtype == np.float32
    np.testing.assert_allclose(a["actions"], np.clip(a["sample"][:, :, -1] * 0.5 + 0.1, -1, 1), atol=1e-6)
