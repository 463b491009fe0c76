"""Each family's published configuration instantiates on the meta device (no memory) at the
published parameter count. OpenVLA-7B: tests/policies/test_prismatic.py (the released folder's layout)."""
from __future__ import annotations

from rlvla3.policies.pi.pi0 import published_pi0


def test_pi0_published_configuration_is_3_5_billion_parameters_without_memory():
    model = published_pi0()
    assert all(p.is_meta for p in model.parameters())
    n = sum(p.numel() for p in model.parameters())
    assert 3.3e9 <= n <= 3.6e9, f"pi0 at its published configuration: {n:,} parameters (published: 3.3-3.5 B)"
    cfg = model.config
    assert (cfg.chunk_size, cfg.max_state_dim, cfg.max_action_dim, cfg.num_inference_steps) == (50, 32, 32, 10)
    assert (cfg.vlm_config.text_config.hidden_size, cfg.dit_config.hidden_size) == (2048, 1024)


def test_pi05_published_configuration_is_lerobots_812_tensors_and_3_6_billion_parameters():
    """docs/layouts/pi05-base.md counted lerobot/pi05_base from LeRobot's own module tree."""
    from rlvla3.policies.pi.pi05 import PUBLISHED_PARAMS, lerobot_name, published_pi05

    model = published_pi05()
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMS == 3_616_757_520
    names = {lerobot_name(k): v.shape for k, v in model.state_dict().items()}
    assert len(names) == 812
    expert = "paligemma_with_expert.gemma_expert.model."
    assert names[expert + "layers.17.input_layernorm.dense.weight"] == (3072, 1024)
    assert names[expert + "norm.dense.bias"] == (3072,) and expert + "norm.weight" not in names
    assert names["time_mlp_in.weight"] == (1024, 1024) and names["action_in_proj.weight"] == (1024, 32)
    assert not any("state_proj" in n or "action_time_mlp" in n for n in names)
    assert names["paligemma_with_expert.paligemma.lm_head.weight"] == (257152, 2048)
    assert not any(n.endswith("embed_tokens.weight") for n in names)   # the file keeps the lm_heads only


def test_openvla_oft_modules_at_the_published_size():
    """OFT's LIBERO head (MLP-ResNet over 7 x 4096 hidden states) and proprio projector (8 -> 4096)."""
    import torch

    from rlvla3.policies.openvla.oft import ActionHead, ProprioProjector

    with torch.device("meta"):
        head, proj = ActionHead(4096, 7), ProprioProjector(4096, 8)
    assert sum(p.numel() for p in head.parameters()) == 151_117_831
    assert sum(p.numel() for p in proj.parameters()) == 16_818_176
    assert head.model.fc1.weight.shape == (4096, 28672) and head.model.fc2.weight.shape == (7, 4096)
