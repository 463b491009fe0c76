"""`python -m rlvla3.sft --demos DIR [--steps N] [--out CKPT] [overrides...]`: supervised warm
start (behaviour cloning) of any policy family on demonstration shards (`python -m rlvla3.collect`).

The policy is built exactly as the RL run builds it (same overrides: env, policy), trained with
its family's cloning loss (`Policy.bc_loss`: -log pi of the expert's action tokens, or pi0's own
flow-matching loss), and saved as a checkpoint whose `model` an RL run starts from:

    python -m rlvla3.collect +experiment=toy --episodes 200 --out runs/demos
    python -m rlvla3.sft --demos runs/demos +experiment=toy --steps 300 --out runs/sft.pt
    python -m rlvla3.launch +experiment=toy policy.init_from=runs/sft.pt

Demonstration rows hold one expert step each; a chunked policy (policy.chunk=K) learns from the
K consecutive actions of each row's env (`chunk_actions`). The value head is not trained here
(RL's critic starts cold).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np


def chunk_actions(actions: np.ndarray, ended: np.ndarray, k: int) -> np.ndarray:
    """Action chunks [T, N, K, D] from one-step rows [T, N, D]: row t's chunk is the actions of
    rows t..t+K-1 of the same env, the episode's (or segment's) last action repeated past its end
    (the usual padding for chunked behaviour cloning)."""
    T = actions.shape[0]
    last = np.zeros(ended.shape, np.int64)   # index of the row that ends row t's episode (or T-1)
    end = np.full(ended.shape[1], T - 1)
    for t in reversed(range(T)):
        end = np.where(ended[t], t, end)
        last[t] = end
    idx = np.minimum(np.arange(T)[:, None, None] + np.arange(k)[None, None, :], last[:, :, None])   # [T, N, K]
    return actions[idx, np.arange(actions.shape[1])[None, :, None]]


def load_demos(demos: Path, chunk: int = 1, encode=None, blind: bool = False) -> dict[str, np.ndarray]:
    """Every valid row of the demonstration shards under `demos` (or `demos/shards`), flattened,
    with `actions` as chunks [rows, K, D] and, given the trained policy's `encode`, its prompts
    (prompt_tokens) in place of the tokens the collecting policy's encoder wrote; `blind`: also
    each row's prompt without the state (`tokens_blind`, for --state-dropout)."""
    from ..engine import shards
    from ..policies.prompts import blind_encoder

    d = demos / "shards" if (demos / "shards").is_dir() else demos
    names = shards.scan(d)
    if not names:
        raise SystemExit(f"--demos {demos}: no shards there (make them with python -m rlvla3.collect)")
    parts = {k: [] for k in ("images", "proprio", "tokens", "actions", *(["tokens_blind"] if blind else []))}
    for n in names:
        a, attrs = shards.read_shard(d / n)
        if attrs.get("source") != "expert":
            raise SystemExit(f"--demos {demos}: shard {n} is a rollout shard, not a demonstration (source "
                             f"{attrs.get('source')!r})")
        m = a["valid"].reshape(-1)
        tokens = a["tokens"] if encode is None else prompt_tokens(a["proprio"], attrs, encode, a["tokens"])
        rows = {"images": a["images"], "proprio": a["proprio"], "tokens": tokens,
                "actions": chunk_actions(a["actions"][:, :, 0], a["terminated"] | a["truncated"], chunk)}
        if blind:
            rows["tokens_blind"] = prompt_tokens(a["proprio"], attrs, blind_encoder(encode), a["tokens"])
        for k in parts:
            parts[k].append(rows[k].reshape(-1, *rows[k].shape[2:])[m])
    return {k: np.concatenate(v) for k, v in parts.items()}


def prompt_tokens(proprio: np.ndarray, attrs: dict, encode, recorded: np.ndarray) -> np.ndarray:
    """A demonstration shard's prompts [T, N, L] as `encode` writes them, from the instructions
    the shard records (its `instructions`: [row, text] where each env's text changes) and, for an
    encoder that reads the state (π0.5), each row's proprio. Demonstrations are collected once and
    cloned into any family, whose prompt may differ from the collecting policy's (π0.5 writes the
    state into it). A shard that records no instructions keeps its `recorded` tokens."""
    from ..policies.prompts import row_encoder

    texts = attrs.get("instructions")
    if not texts:
        return recorded
    prompt = row_encoder(encode)
    T = proprio.shape[0]
    out = None   # rows before an env's first instruction stay 0 (padding; never valid rows)
    for n, changes in enumerate(texts):
        for i, (start, text) in enumerate(changes):
            stop = changes[i + 1][0] if i + 1 < len(changes) else T
            for t in range(start, stop):
                ids = prompt(text, proprio[t, n])
                if out is None:
                    out = np.zeros((T, len(texts), len(ids)), np.int32)
                out[t, n] = ids
    return out


def load_rows(demos: Path, cfg, cameras: dict[str, str], blind: bool = False) -> dict[str, np.ndarray]:
    """The demonstrations of --demos: the project's shards, or a LeRobotDataset mapped onto cfg.env.
    `blind`: with each row's prompt without the state too (--state-dropout; shards only)."""
    from .lerobot_dataset import DatasetError, is_lerobot, load_lerobot

    if not is_lerobot(demos):
        from ..policies.prompts import instruction_encoder

        return load_demos(demos, cfg.policy.chunk, instruction_encoder(cfg.policy), blind)
    if blind:
        raise SystemExit(f"--state-dropout with a LeRobotDataset ({demos}): not supported yet; collect "
                         "demonstration shards (python -m rlvla3.collect) or drop --state-dropout")
    try:
        rows = load_lerobot(demos, cfg, cameras)
    except DatasetError as e:
        raise SystemExit(f"--demos {demos}: {e}") from None
    ended = rows.pop("ended")
    rows["actions"] = chunk_actions(rows["actions"][:, None], ended[:, None], cfg.policy.chunk)[:, 0]
    return rows


def parse_cameras(text: str) -> dict[str, str]:
    """--cameras agentview=observation.images.image,... -> {env camera: dataset feature}."""
    pairs = [p.split("=", 1) for p in text.split(",") if p.strip()]
    bad = [p[0] for p in pairs if len(p) != 2]
    if bad:
        raise SystemExit(f"--cameras {text!r}: {bad[0]!r} is not camera=feature")
    return {k.strip(): v.strip() for k, v in pairs}


def random_shift(images, shift: int, gen):
    """Each image of a batch [B, cameras, H, W, C] moved by its own random offset of up to `shift`
    pixels in each direction, the edge pixels repeated into the gap (DrQ's random shift). Cloning
    a hundred demonstrations from pixels overfits to where things sit in them exactly; shifted
    copies make the policy read positions relative to what it sees. 0 returns `images` itself."""
    import torch

    if shift == 0:
        return images
    b, cams, h, w, c = images.shape
    n = b * cams
    dy, dx = torch.randint(-shift, shift + 1, (2, n), generator=gen)
    rows = (torch.arange(h)[None] + dy[:, None]).clamp(0, h - 1)      # [n, H]: source row of each output row
    cols = (torch.arange(w)[None] + dx[:, None]).clamp(0, w - 1)
    flat = images.reshape(n, h, w, c)
    return flat[torch.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]].reshape(images.shape)


def train(cfg, rows: dict[str, np.ndarray], steps: int, batch: int, lr: float, seed: int = 0,
          lr_decay: bool = False, shift: int = 0, state_dropout: float = 0.0):
    """Clone the demonstrations into the policy of `cfg`; returns (policy, loss history, the names
    of the parameters no gradient reached). The expert's action chunks are turned into the policy's
    own sample (token ids, a Gaussian's mean or a chain) by the policy, with a released checkpoint's
    own action normalisation. `lr_decay`: the learning rate falls linearly to 0 at the last step
    (the RL runs' schedule, algo.lr_at).
    `shift`: each batch's images randomly shifted by up to that many pixels (random_shift).
    `state_dropout`: the share of a batch's rows that see no state (drop_state)."""
    import torch

    from ..algo import lr_at
    from ..policies import make_policy
    from ..policies.base import pick_device
    from ..policies.lora import trainable
    from ..world import spec

    torch.manual_seed(seed)
    sp = spec(cfg)
    if rows["actions"].shape[1:] != (sp.chunk, sp.action_dim):
        raise SystemExit(f"demonstrations hold actions of shape {rows['actions'].shape[1:]}; the policy acts in "
                         f"chunks of {(sp.chunk, sp.action_dim)}: collect them on the same env")
    device = pick_device(cfg.policy.device)
    policy = make_policy(cfg, sp).to(device)
    rows = {**rows, "sample": policy.expert_sample(sp.sample, rows["actions"], cfg.policy.action_bins)}
    params = trainable(policy)   # a pretrained folder: its LoRA adapters and heads (policy.lora_rank)
    opt = torch.optim.Adam(params, lr=lr)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    t = {k: torch.from_numpy(v) for k, v in rows.items()}
    history, every, t0 = [], max(1, steps // 10), time.time()
    # Parameters no step's gradient has reached yet (zero_grad sets grads to None each step).
    unreached = {n: p for n, p in policy.named_parameters() if p.requires_grad}
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(lr, step + 1, 0, steps, lr_decay)
        idx = torch.from_numpy(rng.integers(0, len(rows["sample"]), batch))
        proprio, tokens = drop_state(t, idx, state_dropout, gen)
        mb = [random_shift(t["images"][idx], shift, gen).to(device), proprio.to(device), tokens.to(device),
              *(t[k][idx].to(device) for k in ("sample", "actions"))]
        loss = policy.bc_loss(*mb).mean()
        opt.zero_grad()
        loss.backward()
        unreached = {n: p for n, p in unreached.items() if p.grad is None}
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append(float(loss.detach()))
        if (step + 1) % every == 0:   # a long SFT says how far it is
            print(f"  step {step + 1}/{steps}  loss {np.mean(history[-every:]):.3f}  {time.time() - t0:.0f}s", flush=True)
    # What the cloning loss never reaches (the value head; pi0/pi05/OFT's sampling std) stays at
    # its init: the checkpoint names it, so an RL run starting from it takes it from its own config
    # (torch_learner.load_init), e.g. the flow noise std it explores with, not SFT's copy. Tracked
    # by gradient, not by comparing with a copy of the initial weights (a 7B model's second copy).
    return policy, history, list(unreached)


def drop_state(t: dict, idx, share: float, gen):
    """The batch's proprio and prompts with a random `share` of its rows blind to the state: proprio
    0 and the prompt without it (`tokens_blind`). A policy whose prompt holds the state (π0.5) can
    fit the demonstrations from the state alone and learn nothing from its images (docs/results/libero.md):
    rows without it must be acted on from the images."""
    import torch

    proprio, tokens = t["proprio"][idx], t["tokens"][idx]
    if share == 0:
        return proprio, tokens
    drop = torch.rand(len(idx), generator=gen) < share
    return proprio.masked_fill(drop[:, None], 0.0), torch.where(drop[:, None], t["tokens_blind"][idx], tokens)


def keep_state_record(demos: Path, out: Path) -> None:
    """The demonstrations' initial-state record (LIBERO's init_states.json, written by collect)
    beside the checkpoint as <out stem>.init_states.json: the protocol then knows whether the
    policy saw its test states (tools/libero_protocol.refuse_trained_on_test_states)."""
    folder = demos.parent if demos.name == "shards" else demos   # --demos takes the run folder or its shards/
    record = folder / "init_states.json"
    if record.is_file():
        (out.parent / f"{out.stem}.init_states.json").write_text(record.read_text())


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.sft", description=__doc__.split("\n\n")[0])
    ap.add_argument("--demos", required=True,
                    help="a collect run folder (or its shards/ folder), or a LeRobotDataset folder (v3.0 or v2.1)")
    ap.add_argument("--cameras", default="", help="LeRobotDataset: env camera=dataset feature,... "
                    "(default: camera c reads observation.images.c)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=64, help="rows per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    ap.add_argument("--lr-decay", action="store_true",
                    help="decay the learning rate linearly to 0 at the last step (a longer SFT ends lower)")
    ap.add_argument("--shift", type=int, default=0,
                    help="random-shift augmentation: move each image up to this many pixels (4 for 64x64 "
                         "images, as DrQ does for 84x84); 0 = none")
    ap.add_argument("--state-dropout", type=float, default=0.0,
                    help="share of each batch's rows trained without the state (proprio 0, π0.5's prompt "
                         "without it), so the images must carry them; 0 = none")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (default: every core; SFT is one process, unlike a run's ranks)")
    ap.add_argument("--out", default="sft.pt", help="the checkpoint to write (policy.init_from of the RL run)")
    ap.add_argument("overrides", nargs="*", help="config overrides: the RL run's env and policy")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_intermixed_args(argv)
    import torch

    from ..cluster.compose import compose

    cfg = compose(a.overrides)
    most = cfg.env.image_size // 2 - 1   # beyond half the side an image is mostly repeated edge
    if not 0 <= a.shift <= most:   # before the demonstrations load (LIBERO's: hundreds of MB)
        raise SystemExit(f"--shift {a.shift}: give 0 (none) to {most} pixels for env.image_size="
                         f"{cfg.env.image_size}; 4 suits 64x64")
    if not 0 <= a.state_dropout < 1:
        raise SystemExit(f"--state-dropout {a.state_dropout}: give a share in [0, 1) of the rows (0.5 drops half)")
    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    rows = load_rows(Path(a.demos), cfg, parse_cameras(a.cameras), a.state_dropout > 0)
    t0 = time.time()
    policy, hist, untouched = train(cfg, rows, a.steps, a.batch, a.lr, cfg.seed, a.lr_decay, a.shift, a.state_dropout)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": policy.state_dict(), "sft": {"demos": str(a.demos), "rows": len(rows["actions"]),
                                                      "steps": a.steps, "lr": a.lr,
                                                      "lr_decay": a.lr_decay, "shift": a.shift,
                                                      "state_dropout": a.state_dropout, "loss": hist,
                                                      "untrained": untouched}}, out)
    keep_state_record(Path(a.demos), out)
    k = max(1, len(hist) // 10)
    print(f"SFT {cfg.policy.name}: {len(rows['actions'])} demonstration rows, {a.steps} steps in {time.time() - t0:.0f}s; "
          f"loss {np.mean(hist[:k]):.3f} -> {np.mean(hist[-k:]):.3f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
