"""Each family's published configuration instantiates on the meta device (no memory) at the
published parameter count. OpenVLA-7B: tests/test_prismatic.py (the released folder's layout)."""
from __future__ import annotations

from rlvla3.policies.pi0 import published_pi0_on_meta


def test_pi0_published_configuration_is_3_5_billion_parameters_without_memory():
    model = published_pi0_on_meta()
    assert all(p.is_meta for p in model.parameters())
    n = sum(p.numel() for p in model.parameters())
    assert 3.3e9 <= n <= 3.6e9, f"pi0 at its published configuration: {n:,} parameters (published: 3.3-3.5 B)"
    cfg = model.config
    assert (cfg.chunk_size, cfg.max_state_dim, cfg.max_action_dim, cfg.num_inference_steps) == (50, 32, 32, 10)
    assert (cfg.vlm_config.text_config.hidden_size, cfg.dit_config.hidden_size) == (2048, 1024)
