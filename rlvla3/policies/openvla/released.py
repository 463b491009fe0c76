"""`openvla` from a released OpenVLA folder (`policy.pretrained`: openvla/openvla-7b or a fine-tune
such as openvla-7b-finetuned-libero-spatial): the published Prismatic model (prismatic.py),
decoded as the family decodes (openvla.OpenVLA: autoregressive as released, or parallel action
queries as OpenVLA-OFT fine-tunes it), with the checkpoint's own inputs and outputs:

- instruction: the folder's tokenizer and OpenVLA's prompt, encoded by the Simulator
  (openvla.layout.OpenVLAPrompt): [BOS, prompt ..., 29871, padding];
- images: each camera resized and normalised per tower (preprocessor_config.json; LIBERO frames
  arrive already turned 180 degrees, as OpenVLA's LIBERO fine-tunes saw them), its patches
  spliced in after BOS as Prismatic does; the proprio is not an input (OpenVLA has none);
- positions count attended tokens only, so the right padding changes nothing (the released
  model never saw padding);
- actions: bin b of the sample is LM token 31999 - b; `to_env_action` takes the bin centre,
  un-normalises it with norm_stats[policy.unnorm_key] (q01/q99 where the mask is true) and maps
  the gripper (the dim the mask leaves out) from the RLDS convention (1 open, 0 closed) to the
  envs' (-1 open, +1 closed), binarised, as OpenVLA's LIBERO evaluation does;
- log pi is over the 256 action ids (the softmax restricted to them, as RL fine-tuning of
  OpenVLA does); V(s) is a new linear head on the prefix's last hidden state (the release has no
  critic, so it starts at random).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..base import TokenPolicy
from . import prismatic
from .layout import action_stats, gripper_to_dataset, gripper_to_env, norm_stats, unit_bounds
from .layout import check as check_folder
from .model import OpenVLA


class ReleasedOpenVLA(OpenVLA):
    fully_trained = ("value_head",)

    def __init__(self, pcfg, spec, published: bool = False):
        """published: openvla-7b's configuration, random, no folder read, on the default device
        (meta: the Trainer's memory footprint, benchmarks/footprint.py)."""
        TokenPolicy.__init__(self)   # the modules come from the folder, not from `policy` sizes
        torch.manual_seed(pcfg.init_seed)
        if published:
            self.vla, self.pre = prismatic.published_model(torch.get_default_device()), prismatic.PREPROCESSOR
            self.stats = unit_bounds(spec.action_dim)
        else:
            folder = Path(pcfg.pretrained)
            check_folder(pcfg, spec.action_dim, spec.proprio_dim)
            self.vla, cfg = prismatic.load_folder(folder)
            self.pre = prismatic.read_preprocessor(folder)
            self.stats = action_stats(norm_stats(folder, cfg), pcfg.unnorm_key, spec.action_dim)
        self.crop = pcfg.image_crop
        self.action_bins, self.action_dim, self.chunk = pcfg.action_bins, spec.action_dim, spec.chunk
        self.n_act = spec.chunk * spec.action_dim
        self.autoregressive = pcfg.decoding == "autoregressive"
        self.first_action_id = None   # the ids count down (no Megatron LM here: the checks refuse it)
        bins = torch.arange(self.action_bins)
        self.add_heads(self.lm.config.hidden_size, prismatic.LLAMA_VOCAB - 1 - bins)

    @property
    def lm(self):
        return self.vla.lm

    def _prefix(self, images, proprio, tokens):
        """[BOS | every camera's projected patches | the rest of the prompt], mask [n, S]."""
        n = images.shape[0]
        patches = self.vla.patch_features(prismatic.pixels(images.flatten(0, 1), self.pre, self.crop))
        patches = patches.reshape(n, -1, patches.shape[-1])   # cameras in env.cameras order
        words = self.lm.get_input_embeddings()(tokens.long())
        emb = torch.cat([words[:, :1], patches.to(words.dtype), words[:, 1:]], 1)
        seen = torch.ones(n, 1 + patches.shape[1], dtype=torch.long, device=tokens.device)
        return emb, torch.cat([seen, (tokens[:, 1:] != 0).long()], 1)

    def _positions(self, mask: torch.Tensor) -> torch.Tensor:
        return (mask.cumsum(-1) - 1).clamp(min=0)

    def to_env_action(self, sample: np.ndarray) -> np.ndarray:
        tokens = prismatic.LLAMA_VOCAB - 1 - torch.from_numpy(np.asarray(sample)).long()
        a = prismatic.tokens_to_actions(tokens.reshape(-1, self.action_dim), self.stats, self.action_bins).numpy()
        gripper = ~np.asarray(self.stats["mask"], bool)
        a[:, gripper] = gripper_to_env(a[:, gripper])
        return np.clip(a, -1.0, 1.0).astype(np.float32).reshape(-1, self.chunk, self.action_dim)

    def expert_sample(self, layout, actions: np.ndarray, bins: int) -> np.ndarray:
        """Env actions -> the folder's dataset units (gripper 1 open / 0 closed) -> OpenVLA's
        bins of the q01/q99-normalised action (bin b is LM token 31999 - b)."""
        a = np.asarray(actions, np.float32).reshape(-1, self.action_dim).copy()
        gripper = ~np.asarray(self.stats["mask"], bool)
        a[:, gripper] = gripper_to_dataset(a[:, gripper])
        tokens = prismatic.actions_to_tokens(torch.from_numpy(a), self.stats, self.action_bins).numpy()
        return (prismatic.LLAMA_VOCAB - 1 - tokens).astype(layout.dtype).reshape(-1, *layout.shape)
