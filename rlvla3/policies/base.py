"""The policy interface the Generator and Trainer use.

A policy maps a batch of observations (images uint8 [n, cams, H, W, 3], proprio float32 [n, P],
instruction tokens int32 [n, L]) to a distribution over what it samples (its `SampleLayout`:
action token ids, or a denoising chain) and a value estimate V(s):
- `act(obs, noise)` samples with the given noise, so a sample depends only on its own noise,
  never on which other samples share the batch; returns (sample, log pi(sample|s), V(s));
- `evaluate(obs, sample)` returns log pi(sample|s), entropy and V(s) with gradients, for the
  Trainer (log pi of the same weights must match `act`'s: algo.check_logprobs measures it);
  with `per_token=True` (algo.ratio=token) each action token's log pi, or for a continuous chunk
  each action coordinate's [n, K*D];
- `to_env_action(sample)` maps a sample to the env's action chunk [n, K, D] in [-1, 1].

`TokenPolicy` is the discrete-token case (OpenVLA-style bins): a family gives per-token logits
and V(s), and sampling is Gumbel-max over the `action_bins` of each of the K*D action tokens.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .lora import ServedAdapters, trainable
from .sampling import expert_sample, tokens_to_actions


class Policy(nn.Module):
    action_bins: int
    chunk: int
    action_dim: int
    # Submodules trained in full under LoRA (what RL or the family adds to the pretrained
    # backbone); the backbone's linear layers get adapters, its other weights stay frozen.
    fully_trained: tuple[str, ...] = ("value_head",)
    # Submodules whose transformer layers write a KV cache in `evaluate` (not checkpointed).
    cache_writers: tuple[str, ...] = ()

    def shard_units(self) -> list[nn.Module]:
        """The modules policy.data_parallel=fsdp shards as one unit each (gathered just before
        their forward, freed after it): the transformer layers. A unit must be entered through
        its forward; a family that reaches into a layer's parts names those parts instead."""
        from transformers.modeling_layers import GradientCheckpointingLayer

        return [m for m in self.modules() if isinstance(m, GradientCheckpointingLayer)]

    def act(self, images, proprio, tokens, noise):
        raise NotImplementedError

    def evaluate(self, images, proprio, tokens, sample, per_token: bool = False):
        raise NotImplementedError

    @staticmethod
    def coordinate_logp(logp: torch.Tensor, per_token: bool) -> torch.Tensor:
        """A continuous chunk's log pi per action coordinate [n, K, D] -> the sample's [n], or with
        `per_token` each coordinate's [n, K*D], chunk-major as a token family's tokens
        (algo.ratio=token: the field's "token level" for continuous actions)."""
        return logp.flatten(1) if per_token else logp.sum((-1, -2))

    def to_env_action(self, sample: np.ndarray) -> np.ndarray:
        return tokens_to_actions(sample, self.action_bins, self.chunk, self.action_dim)

    def expert_sample(self, layout, actions: np.ndarray, bins: int) -> np.ndarray:
        """Env action chunks [n, K, D] as the sample `to_env_action` maps back to them (SFT's
        targets); a released checkpoint's family applies its own action normalisation."""
        return expert_sample(layout, actions, bins)

    def bc_loss(self, images, proprio, tokens, sample, actions):
        """Behaviour cloning loss per sample [n] (SFT): -log pi(expert sample | obs)."""
        return -self.evaluate(images, proprio, tokens, sample)[0]


def zero_batch(spec, n: int, device: str | torch.device = "meta") -> tuple[torch.Tensor, ...]:
    """One micro-batch of observations and stored samples (zeros; token id 1 everywhere): the
    Trainer's zero-weight micro-batch, and the memory benchmark's input."""
    with torch.device(device):
        images = torch.zeros(n, spec.cameras, spec.image_size, spec.image_size, 3, dtype=torch.uint8)
        proprio = torch.zeros(n, spec.proprio_dim)
        tokens = torch.ones(n, spec.instruction_len, dtype=torch.int32)
        sample = torch.zeros(n, *spec.sample.shape, dtype=getattr(torch, spec.sample.dtype))
    return images, proprio, tokens, sample


def gumbel_argmax(logp_all: torch.Tensor, uniform_noise: torch.Tensor) -> torch.Tensor:
    """Sample from softmax(logp_all) with the given U(0,1) noise (Gumbel-max trick)."""
    gumbel = -torch.log(-torch.log(uniform_noise.clamp(1e-10, 1 - 1e-7)))
    return torch.argmax(logp_all + gumbel, -1)


def token_logp_entropy(logits: torch.Tensor, tokens: torch.Tensor,
                       per_token: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log p of the action tokens summed over them [n] (per_token: each token's [n, T]) and the
    summed per-token entropy [n]."""
    logp_all = torch.log_softmax(logits.float(), -1)
    logp = logp_all.gather(-1, tokens.long()[..., None])[..., 0]
    if not per_token:
        logp = logp.sum(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1).sum(-1)
    return logp, entropy


class TokenPolicy(Policy):
    """Action tokens decoded in parallel from one forward: logits [n, K*D, bins] and V(s) [n]."""

    def logits_and_value(self, images, proprio, tokens) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @torch.no_grad()
    def act(self, images, proprio, tokens, noise):
        """Sample action tokens by Gumbel-max with the given U(0,1) noise [n, K*D, bins]."""
        logits, value = self.logits_and_value(images, proprio, tokens)
        tok = gumbel_argmax(torch.log_softmax(logits.float(), -1), noise)
        logp, _ = token_logp_entropy(logits, tok)
        return tok.to(torch.int32), logp, value.float()

    def evaluate(self, images, proprio, tokens, sample, per_token: bool = False):
        """log pi(a|s) [n] (summed over action tokens; per_token: each token's [n, K*D]),
        entropy [n], V(s) [n]."""
        logits, value = self.logits_and_value(images, proprio, tokens)
        logp, entropy = token_logp_entropy(logits, sample, per_token)
        return logp, entropy, value.float()


def flat_params(model: nn.Module) -> np.ndarray:
    """The trainable parameters (all, without LoRA) as one contiguous float32 numpy buffer: what
    travels to Generators, which hold the same frozen weights."""
    return torch.nn.utils.parameters_to_vector([p.detach().float().cpu() for p in trainable(model)]).numpy()


def load_flat_params(model: nn.Module, flat: np.ndarray) -> None:
    params = trainable(model)
    n = sum(p.numel() for p in params)
    if flat.size != n:
        raise ValueError(f"weights buffer has {flat.size} values, the model has {n} trainable parameters")
    vec = torch.from_numpy(flat)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(vec.to(params[0].device), params)


LOCAL_RANK_VARS = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "LOCAL_RANK")


def local_rank(environ=os.environ) -> int:
    """This process's index among the ranks of its node, from the launcher (Slurm, Open MPI,
    MPICH, torchrun); 0 when none says."""
    for name in LOCAL_RANK_VARS:
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 0


def auto_device(n_gpus: int, environ=os.environ) -> str:
    """policy.device=auto: "cpu" without a GPU; with one, the GPU of this rank's local index (the
    ranks of a node spread over its visible GPUs instead of piling onto GPU 0; a site that binds
    one GPU per task shows each rank one device, and this gives cuda:0)."""
    return "cpu" if n_gpus == 0 else f"cuda:{local_rank(environ) % n_gpus}"


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device(auto_device(torch.cuda.device_count() if torch.cuda.is_available() else 0))
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"policy.device={setting} but this rank sees no CUDA device "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__}); "
                           "use policy.device=auto or cpu")
    return torch.device(setting)


class TorchActor:
    """The Generator's side of a torch policy: numpy in, numpy out, weights as one flat buffer."""

    def __init__(self, policy: Policy, device_setting: str):
        self.device = pick_device(device_setting)
        self.policy = policy.to(self.device).eval()
        self.n_params = sum(p.numel() for p in trainable(self.policy))
        self.served = ServedAdapters(self.policy)

    def load(self, flat: np.ndarray) -> None:
        """A version's trainable parameters, LoRA adapters merged into float32 bases (lora.py)."""
        self.served.unmerge()
        load_flat_params(self.policy, flat)
        self.served.merge()

    def act(self, obs: dict[str, np.ndarray], noise: np.ndarray):
        """(sample, log-prob, value) as numpy for a batch of observations."""
        t = {k: torch.from_numpy(v).to(self.device) for k, v in obs.items()}
        with torch.no_grad():
            sample, logp, value = self.policy.act(t["images"], t["proprio"], t["tokens"], torch.from_numpy(noise).to(self.device))
        return sample.cpu().numpy(), logp.float().cpu().numpy(), value.float().cpu().numpy()

    def to_env_action(self, sample: np.ndarray) -> np.ndarray:
        return self.policy.to_env_action(sample)


def require_checkpoint(path: Path, what: str) -> Path:
    """A local checkpoint directory, or a clear error saying which file is missing."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"policy.pretrained: no {what} checkpoint at {path} (expected {path}/config.json and "
                                f"its weights, e.g. model.safetensors, saved by transformers' save_pretrained); "
                                f"nothing is downloaded at run time")
    return path


def load_strict(cls, path: Path, what: str):
    """`cls.from_pretrained(path)` that fails listing every missing, unexpected or misshapen tensor
    (transformers only reports them and initialises the missing ones at random)."""
    model, info = cls.from_pretrained(require_checkpoint(path, what), local_files_only=True, output_loading_info=True)
    bad = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if any(bad.values()):
        raise ValueError(f"policy.pretrained: the {what} checkpoint at {path} does not match its config: "
                         + "; ".join(f"{k.replace('_', ' ')} {v[:8]}{' ...' if len(v) > 8 else ''}" for k, v in bad.items() if v))
    return model


class LayoutError(ValueError):
    """A folder that does not hold its family's released layout; the message names what differs."""


def lerobot_config(folder: Path, family: str, what: str) -> dict:
    """The config.json of a LeRobot policy folder (with its model.safetensors) whose `type` is
    `family`; `what` names the released folder in the errors (e.g. "LeRobot's π0.5 folder, e.g.
    lerobot/pi05_base")."""
    import json

    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"policy.pretrained={folder}: no {name} ({what}, saved locally); nothing is downloaded")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("type") != family:
        raise LayoutError(f"{folder}/config.json: type={cfg.get('type')!r}; policy={family} loads a folder of type {family}")
    return cfg


def check_tensors(tensors: dict, want: dict, where: str, name=lambda k: k) -> None:
    """A folder's tensors against the shapes the model built from its config wants: every
    missing, unexpected or misshapen tensor named (`name`: the folder's name of a module's key)."""
    missing = sorted(name(k) for k in want if k not in tensors)
    unexpected = sorted(name(k) for k in tensors if k not in want)
    shapes = [f"{name(k)}: {tuple(tensors[k].shape)}, expected {tuple(want[k])}" for k in want
              if k in tensors and tensors[k].shape != want[k]]
    if missing or unexpected or shapes:
        raise LayoutError(f"{where}: missing {missing[:8]}, unexpected {unexpected[:8]}, misshapen {shapes[:8]}")


def checked_config(folder_cfg: dict, tensors: dict, config_of, model_cls, where: str, name=lambda k: k):
    """The model config a released folder's config.json and tensors give (`config_of`), its
    tensors checked against the model `model_cls` builds from it on the meta device: a tensor the
    sizes are read from, missing, or any tensor that differs is a LayoutError naming it."""
    try:
        config = config_of(folder_cfg, tensors)
    except KeyError as e:
        raise LayoutError(f"{where}: no {name(e.args[0])}") from None
    with torch.device("meta"):
        want = {k: v.shape for k, v in model_cls(config).state_dict().items()}
    check_tensors(tensors, want, where, name)
    return config
