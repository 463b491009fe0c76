"""`openvla_oft`: a released OpenVLA-OFT fine-tune (e.g. moojink/openvla-7b-oft-finetuned-libero-spatial)
with its continuous L1-regression action head, made into an RL policy.

The folder is a Prismatic OpenVLA folder (prismatic.py; OFT merged its LoRA into every weight)
plus `action_head--<step>_checkpoint.pt` (an MLP-ResNet over the LLM's hidden states) and
`proprio_projector--<step>_checkpoint.pt` (2-layer GELU MLP), saved from DDP modules ("module."
prefixes). Its forward, as OFT's LIBERO evaluation runs it:

    [BOS | patches of each camera (shared projector) | proprio token | prompt ... 29871 |
     K*D zero embeddings | </s>]  -> Llama with *bidirectional* attention (OFT patched it so)
    hidden states (after the final norm) one position before each of the K*D placeholders
    -> [n, K, D * d] (the D tokens of a chunk step side by side) -> action head -> [n, K, D]

The head regresses a normalised chunk (L1 loss in OFT), which has no distribution. For RL the
policy is a Gaussian around it with a learned, state-independent log-std per action dim: the
continuous-control policy of PPO (Schulman et al. 2017, https://arxiv.org/abs/1707.06347), the
same choice ReinFlow and πRL make for their flow policies' noise (pi0.py). The sample is the
normalised chunk; log pi = sum of K*D Gaussian terms. V(s) is a new linear head on the prompt's
last hidden state. `to_env_action` un-normalises with the folder's action q01/q99 (where the mask
is true) and maps the gripper as OFT's LIBERO evaluation does: +1 open (RLDS) -> -1, else +1.
The proprio is normalised with the folder's proprio q01/q99 and clipped to [-1, 1].
Instruction ids come from the Simulator (openvla.layout.OpenVLAPrompt: OFT's prompt is OpenVLA's).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..base import Policy, check_tensors
from . import prismatic
from .layout import bounds, dataset_entry, gripper_to_dataset, gripper_to_env, norm_stats, unit_bounds
from .layout import check as check_folder
from .model import end_of_prefix

LOG_STD_RANGE = (math.log(0.01), 0.0)   # in the normalised action space ([-1, 1] per dim)
EOS = 2                                 # Llama's </s>: OFT keeps it after the placeholders, as in training


class MLPResNet(nn.Module):
    """OFT's action-head body: LN -> fc1 -> ReLU -> blocks of x + ReLU(Linear(LN(x))) -> LN -> fc2."""

    def __init__(self, blocks: int, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.layer_norm1, self.fc1 = nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden)
        self.mlp_resnet_blocks = nn.ModuleList(
            nn.ModuleDict({"ffn": nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.ReLU())})
            for _ in range(blocks))
        self.layer_norm2, self.fc2 = nn.LayerNorm(hidden), nn.Linear(hidden, out_dim)

    def forward(self, x):
        x = torch.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = x + block["ffn"](x)
        return self.fc2(self.layer_norm2(x))


class ActionHead(nn.Module):
    """L1RegressionActionHead's layout: `model.*` = MLPResNet(2 blocks, d * D -> d -> D)."""

    def __init__(self, llm_dim: int, action_dim: int, blocks: int = 2):
        super().__init__()
        self.model = MLPResNet(blocks, llm_dim * action_dim, llm_dim, action_dim)


class ProprioProjector(nn.Module):
    def __init__(self, llm_dim: int, proprio_dim: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(proprio_dim, llm_dim), nn.Linear(llm_dim, llm_dim)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def module_file(folder: Path, name: str) -> Path:
    """The folder's `<name>--<step>_checkpoint.pt` (one, whatever the step)."""
    found = sorted(folder.glob(f"{name}--*_checkpoint.pt"))
    if len(found) != 1:
        raise FileNotFoundError(f"policy.pretrained={folder}: {len(found)} files {name}--<step>_checkpoint.pt "
                                f"({[f.name for f in found]}); a released OFT folder has exactly one")
    return found[0]


def load_module(module: nn.Module, path: Path) -> None:
    """A DDP-saved state dict ("module." prefixes), strictly: what differs is named."""
    sd = {k.removeprefix("module."): v for k, v in torch.load(path, map_location="cpu", weights_only=True).items()}
    check_tensors(sd, {k: v.shape for k, v in module.state_dict().items()}, f"{path}: not OFT's layout")
    module.load_state_dict({k: v.float() for k, v in sd.items()})


def head_sizes(path: Path) -> tuple[int, int]:
    """(llm width, action dim) of an action-head file, from its tensors."""
    sd = torch.load(path, map_location="cpu", weights_only=True)
    fc2 = next(v for k, v in sd.items() if k.endswith("model.fc2.weight"))
    return fc2.shape[1], fc2.shape[0]


class ReleasedOFT(Policy):
    # OFT's own LoRA recipe trains its action head and proprio projector in full.
    fully_trained = ("value_head", "action_head", "proprio_projector")

    def __init__(self, pcfg, spec, published: bool = False):
        """published: the released configuration (openvla-7b + OFT's modules), random, no folder
        read, on the default device (meta: the Trainer's memory footprint, benchmarks/footprint.py)."""
        super().__init__()
        torch.manual_seed(pcfg.init_seed)
        self.chunk, self.action_dim, self.crop = spec.chunk, spec.action_dim, pcfg.image_crop
        if published:
            self.vla, self.pre = prismatic.published_model(torch.get_default_device()), prismatic.PREPROCESSOR
            d = self.vla.lm.config.hidden_size
            self.action_head, self.proprio_projector = ActionHead(d, spec.action_dim), ProprioProjector(d, spec.proprio_dim)
            self.stats, prop = unit_bounds(spec.action_dim), unit_bounds(spec.proprio_dim)
        else:
            self.stats, prop = self._load(pcfg, spec)
        for name, v in (("proprio_q01", prop["q01"]), ("proprio_q99", prop["q99"])):
            self.register_buffer(name, torch.tensor(v, dtype=torch.float32), persistent=False)
        self.register_buffer("proprio_mask", torch.tensor(prop["mask"]), persistent=False)
        self.log_std = nn.Parameter(torch.full((spec.action_dim,), math.log(pcfg.flow_noise_std)))
        self.value_head = nn.Linear(self.vla.lm.config.hidden_size, 1)

    def _load(self, pcfg, spec) -> tuple[dict, dict]:
        """The released folder's model, modules and (action, proprio) statistics."""
        folder = Path(pcfg.pretrained)
        check_folder(pcfg, spec.action_dim, spec.proprio_dim)
        self.vla, cfg = prismatic.load_folder(folder)
        self.pre = prismatic.read_preprocessor(folder)
        d = self.vla.lm.config.hidden_size
        head_file = module_file(folder, "action_head")
        if head_sizes(head_file) != (d, spec.action_dim):
            raise prismatic.LayoutError(f"{head_file}: an action head for {head_sizes(head_file)} (LLM width, action dims); "
                                        f"this model has width {d} and the env {spec.action_dim} action dims")
        self.action_head = ActionHead(d, spec.action_dim)
        load_module(self.action_head, head_file)
        self.proprio_projector = ProprioProjector(d, spec.proprio_dim)
        load_module(self.proprio_projector, module_file(folder, "proprio_projector"))
        key, entry = dataset_entry(norm_stats(folder, cfg), pcfg.unnorm_key)
        return (bounds(entry, "action", key, spec.action_dim),
                bounds(entry, "proprio", key, spec.proprio_dim))

    # ------------------------------------------------------------ the forward
    def _proprio(self, proprio):
        lo, hi = self.proprio_q01, self.proprio_q99
        x = torch.where(self.proprio_mask, 2 * (proprio.float() - lo) / (hi - lo + 1e-8) - 1, proprio.float())
        return x.clamp(-1, 1)

    def _sequence(self, images, proprio, tokens):
        """Embeddings [n, S], key mask [n, S], where the placeholders start, the prompt's last token."""
        n, lm = images.shape[0], self.vla.lm
        patches = self.vla.patch_features(prismatic.pixels(images.flatten(0, 1), self.pre, self.crop))
        patches = patches.reshape(n, -1, patches.shape[-1])
        words = lm.get_input_embeddings()(tokens.long())
        prop = self.proprio_projector(self._proprio(proprio))[:, None].to(words.dtype)
        holes = words.new_zeros(n, self.chunk * self.action_dim, words.shape[-1])
        eos = lm.get_input_embeddings()(torch.full((n, 1), EOS, device=tokens.device))
        emb = torch.cat([words[:, :1], patches, prop, words[:, 1:], holes, eos], 1)
        ones = lambda k: torch.ones(n, k, dtype=torch.long, device=tokens.device)  # noqa: E731
        mask = torch.cat([ones(2 + patches.shape[1]), (tokens[:, 1:] != 0).long(), ones(holes.shape[1] + 1)], 1)
        start = 2 + patches.shape[1] + tokens.shape[1] - 1
        return emb, mask, start, end_of_prefix(mask[:, :start])

    def mean_and_value(self, images, proprio, tokens):
        """The head's normalised chunk [n, K, D] and V(s) [n]."""
        emb, mask, start, last = self._sequence(images, proprio, tokens)
        n = emb.shape[0]
        blocked = ~mask.bool()[:, None, None, :].expand(n, 1, mask.shape[1], mask.shape[1])
        bias = torch.zeros(blocked.shape, dtype=emb.dtype, device=emb.device).masked_fill(blocked, torch.finfo(emb.dtype).min)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        h = self.vla.lm.model(inputs_embeds=emb, attention_mask=bias, position_ids=pos).last_hidden_state
        rows = torch.arange(n, device=h.device)
        # one position before each placeholder (the next-token shift OFT trained with): the prompt's
        # last token, then the first K*D - 1 placeholders
        at = torch.cat([last[:, None], start + torch.arange(self.chunk * self.action_dim - 1, device=h.device).expand(n, -1)], 1)
        feats = h[rows[:, None], at].reshape(n, self.chunk, -1)
        return self.action_head.model(feats), self.value_head(h[rows, last])[:, 0]

    def _sigma(self):
        return self.log_std.clamp(*LOG_STD_RANGE).exp()

    # ------------------------------------------------------------ the policy interface
    @torch.no_grad()
    def act(self, images, proprio, tokens, noise):
        mean, value = self.mean_and_value(images, proprio, tokens)
        sample = mean + self._sigma() * noise
        return sample, torch.distributions.Normal(mean, self._sigma()).log_prob(sample).sum((-1, -2)), value.float()

    def evaluate(self, images, proprio, tokens, sample, per_token: bool = False):
        mean, value = self.mean_and_value(images, proprio, tokens)
        sigma = self._sigma()
        logp = self.coordinate_logp(torch.distributions.Normal(mean, sigma).log_prob(sample), per_token)
        # repeat, not expand: a tensor of its own, not a view (FSDP hooks the outputs)
        entropy = ((0.5 * math.log(2 * math.pi * math.e) + sigma.log()).sum() * self.chunk).repeat(images.shape[0])
        return logp, entropy, value.float()

    def bc_loss(self, images, proprio, tokens, sample, actions):
        """OFT's own L1 regression of the normalised chunk (SFT)."""
        return (self.mean_and_value(images, proprio, tokens)[0] - sample).abs().mean((-1, -2))

    def _action_bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q01, q99 and the mask of the dims they normalise (the rest: the gripper)."""
        return (np.asarray(self.stats["q01"], np.float32), np.asarray(self.stats["q99"], np.float32),
                np.asarray(self.stats["mask"], bool))

    def to_env_action(self, sample: np.ndarray) -> np.ndarray:
        a = np.asarray(sample, np.float32).reshape(-1, self.action_dim)
        q01, q99, mask = self._action_bounds()
        a = np.where(mask, 0.5 * (a + 1) * (q99 - q01 + 1e-8) + q01, a)
        a[:, ~mask] = gripper_to_env(a[:, ~mask])
        return np.clip(a, -1.0, 1.0).reshape(-1, self.chunk, self.action_dim).astype(np.float32)

    def expert_sample(self, layout, actions: np.ndarray, bins: int) -> np.ndarray:
        """Env actions -> the regressed chunk's units: q01/q99-normalised, the gripper 1 open / 0 closed."""
        a = np.asarray(actions, np.float32).reshape(-1, self.action_dim)
        q01, q99, mask = self._action_bounds()
        x = np.where(mask, np.clip(2 * (a - q01) / (q99 - q01 + 1e-8) - 1, -1, 1), gripper_to_dataset(a))
        return x.astype(np.float32).reshape(-1, *layout.shape)


def write_tiny_folder(folder: str | Path, norm_stats: dict, action_dim: int, proprio_dim: int, seed: int = 0) -> None:
    """A released-layout OFT folder at prismatic.TINY sizes: the Prismatic folder, dataset
    statistics with action and proprio entries, and the two module files (DDP "module." names)."""
    import json

    model = prismatic.write_tiny_folder(folder, norm_stats, seed)
    folder = Path(folder)
    (folder / "dataset_statistics.json").write_text(json.dumps(norm_stats, indent=1))
    d = model.lm.config.hidden_size
    for name, module in (("action_head", ActionHead(d, action_dim)), ("proprio_projector", ProprioProjector(d, proprio_dim))):
        for p in module.parameters():
            p.data.normal_(0, 0.2)
        torch.save({f"module.{k}": v.to(torch.bfloat16 if name == "action_head" else torch.float32)
                    for k, v in module.state_dict().items()}, folder / f"{name}--150000_checkpoint.pt")
