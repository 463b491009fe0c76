"""The published OpenVLA layout (rlvla3/policies/openvla/prismatic.py): a tiny checkpoint written under the
released folder's file, config and tensor names loads back exactly; a folder that differs fails
naming the tensor; openvla-7b's published configuration has the published parameter count (meta
device, no memory); OpenVLA's action tokens and un-normalisation round-trip."""
from __future__ import annotations

import json

import pytest
import torch

from rlvla3.policies.openvla import prismatic as pz
from rlvla3.policies.openvla.layout import openvla_prompt

STATS = {"libero_spatial_no_noops": {"action": {"q01": [-0.5] * 6 + [-1.0], "q99": [0.7] * 6 + [1.0],
                                                "mask": [True] * 6 + [False]}}}


def tiny_folder(tmp_path):
    folder = tmp_path / "openvla"
    return pz.write_tiny_folder(folder, STATS), folder


def test_a_tiny_checkpoint_in_the_released_layout_loads_back_exactly(tmp_path):
    model, folder = tiny_folder(tmp_path)
    names = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert "vision_backbone.featurizer.blocks.0.attn.qkv.weight" in names and "vision_backbone.featurizer.reg_token" in names
    assert "vision_backbone.featurizer.blocks.2.ls1.scale_factor" in names and "projector.fc3.weight" in names
    assert "vision_backbone.fused_featurizer.attn_pool.kv.weight" in names and "language_model.lm_head.weight" in names
    assert len(set(names.values())) == 2 and (folder / "dataset_statistics.json").is_file()
    loaded, cfg = pz.load_folder(folder)
    assert cfg["norm_stats"] == STATS and [t.config.num_hidden_layers for t in loaded.towers] == [3, 3]
    pixels = torch.randn(2, 6, 28, 28)
    with torch.no_grad():
        assert torch.allclose(model.patch_features(pixels), loaded.patch_features(pixels), atol=1e-5)
        ids = torch.randint(0, 32064, (2, 5))
        assert torch.equal(model.lm(ids).logits, loaded.lm(ids).logits)


def test_patch_features_are_the_second_to_last_blocks_patches_of_both_towers(tmp_path):
    """DINOv2 drops its cls token and 4 registers; the features change with the image; no final norm."""
    model, _ = tiny_folder(tmp_path)
    pixels = torch.randn(1, 6, 28, 28)
    with torch.no_grad():
        feats = model.patch_features(pixels)
        dino = model.towers[0](pixel_values=pixels[:, :3], output_hidden_states=True)
        assert feats.shape == (1, 4, 32) and dino.hidden_states[-2].shape == (1, 1 + 4 + 4, 32)
        assert not torch.allclose(feats, model.patch_features(pixels.flip(-1)))


@pytest.mark.parametrize("damage", ["missing", "extra", "shape"])
def test_a_folder_that_is_not_the_released_layout_fails_naming_the_tensor(tmp_path, damage):
    from safetensors.torch import load_file, save_file

    _, folder = tiny_folder(tmp_path)
    shard = folder / "model-00001-of-00002.safetensors"
    t = load_file(shard)
    name = "vision_backbone.featurizer.blocks.1.mlp.fc2.weight"
    assert name in t
    if damage == "missing":
        del t[name]
    elif damage == "extra":
        t["vision_backbone.featurizer.blocks.1.mlp.fc3.weight"] = torch.zeros(2)
        name = "vision_backbone.featurizer.blocks.1.mlp.fc3.weight"
    else:
        t[name] = torch.zeros(3, 3)
    save_file(t, shard, metadata={"format": "pt"})
    with pytest.raises(pz.LayoutError, match=name.replace(".", r"\.")):
        pz.load_folder(folder)


def test_a_folder_without_weights_or_config_is_named(tmp_path):
    _, folder = tiny_folder(tmp_path)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors is named in the index but missing"):
        pz.load_folder(folder)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        pz.load_folder(tmp_path)


def test_the_published_configuration_has_the_published_parameter_count_without_memory():
    model = pz.published_model()
    assert all(p.is_meta for p in model.parameters())
    counts = [sum(p.numel() for p in m.parameters()) for m in (*model.towers, model.projector, model.lm)]
    # The released folder's 7,541,237,184 tensors; transformers' DINOv2 adds a mask token and the
    # cls position (1,024 each), which the loader fills with zeros.
    assert sum(counts) == pz.PUBLISHED_PARAMS + 2048
    assert counts == [303_233_024, 427_680_704, 71_385_600, 6_738_939_904]


def test_action_tokens_round_trip_through_the_norm_stats():
    stats = STATS["libero_spatial_no_noops"]["action"]
    actions = torch.tensor([[-0.5, 0.7, 0.1, 0.0, -0.2, 0.3, 1.0], [0.69, -0.49, 0.6, 0.2, 0.0, -0.1, -1.0]])
    tokens = pz.actions_to_tokens(actions, stats)
    assert tokens.min() >= 31744 and tokens.max() <= 31999
    back = pz.tokens_to_actions(tokens, stats)
    half_bin = 0.6 / 255   # a bin is 2/255 wide in [-1, 1], (q99 - q01) / 255 = 1.2/255 in these units
    assert torch.all((back[:, :6] - actions[:, :6]).abs() <= half_bin + 1e-6)
    assert torch.allclose(back[:, 6], torch.tensor([0.99607843, -0.99607843]), atol=1e-6)   # gripper: not un-normalised
    assert pz.tokens_to_actions(torch.tensor([31999]), {"q01": [0.0], "q99": [2.0]}).item() == pytest.approx(1 / 255)


def test_images_get_each_towers_own_size_and_normalisation_from_the_folder(tmp_path):
    """preprocessor_config.json decides: DINOv2 ImageNet mean/std, SigLIP 0.5/0.5, naive resize."""
    model, folder = tiny_folder(tmp_path)
    pre = pz.read_preprocessor(folder)
    assert pre["input_sizes"] == [[3, 28, 28], [3, 28, 28]] and pre["means"][0] == [0.485, 0.456, 0.406]
    white = torch.full((2, 64, 48, 3), 255, dtype=torch.uint8)   # not square: resized, aspect not kept
    x = pz.pixels(white, pre)
    assert x.shape == (2, 6, 28, 28)
    assert torch.allclose(x[0, :3, 5, 5], (1 - torch.tensor([0.485, 0.456, 0.406])) / torch.tensor([0.229, 0.224, 0.225]))
    assert torch.allclose(x[0, 3:], torch.ones(3, 28, 28))
    with torch.no_grad():
        assert model.patch_features(x).shape == (2, 4, 32)
    assert openvla_prompt("Put the Bowl on the plate ") == "In: What action should the robot take to put the bowl on the plate?\nOut:"
    (folder / "preprocessor_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        pz.read_preprocessor(folder)
