"""`python -m rlvla3.sft --demos DIR [--steps N] [--out CKPT] [overrides...]`: supervised warm
start (behaviour cloning) of any policy family on demonstration shards (`python -m rlvla3.collect`).

The policy is built exactly as the RL run builds it (same overrides: env, policy), trained with
its family's cloning loss (`Policy.bc_loss`: -log pi of the expert's action tokens, or pi0's own
flow-matching loss), and saved as a checkpoint whose `model` an RL run starts from:

    python -m rlvla3.collect +experiment=toy --episodes 200 --out runs/demos
    python -m rlvla3.sft --demos runs/demos +experiment=toy --steps 300 --out runs/sft.pt
    python -m rlvla3.launch +experiment=toy policy.init_from=runs/sft.pt

Demonstration rows hold one expert step each, so SFT needs policy.chunk=1 (chunked SFT from
consecutive rows is not written yet). The value head is not trained here (RL's critic starts cold).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def load_demos(demos: Path) -> dict[str, np.ndarray]:
    """Every valid row of the demonstration shards under `demos` (or `demos/shards`), flattened."""
    from . import shards

    d = demos / "shards" if (demos / "shards").is_dir() else demos
    names = shards.scan(d)
    if not names:
        raise SystemExit(f"--demos {demos}: no shards there (make them with python -m rlvla3.collect)")
    parts = {k: [] for k in ("images", "proprio", "tokens", "sample", "actions")}
    for n in names:
        a, attrs = shards.read_shard(d / n)
        if attrs.get("source") != "expert":
            raise SystemExit(f"--demos {demos}: shard {n} is a rollout shard, not a demonstration (source "
                             f"{attrs.get('source')!r})")
        m = a["valid"].reshape(-1)
        for k in parts:
            parts[k].append(a[k].reshape(-1, *a[k].shape[2:])[m])
    return {k: np.concatenate(v) for k, v in parts.items()}


def train(cfg, rows: dict[str, np.ndarray], steps: int, batch: int, lr: float, seed: int = 0):
    """Clone the demonstrations into the policy of `cfg`; returns (policy, loss history)."""
    import torch

    from .envs import spec
    from .policies import make_policy
    from .policies.base import pick_device

    torch.manual_seed(seed)
    sp = spec(cfg)
    if rows["sample"].shape[1:] != sp.sample.shape:
        raise SystemExit(f"demonstrations hold samples of shape {rows['sample'].shape[1:]}, policy {cfg.policy.name} "
                         f"(chunk {cfg.policy.chunk}) samples {sp.sample.shape}: collect them with the same env and "
                         f"policy overrides, and policy.chunk=1")
    device = pick_device(cfg.policy.device)
    policy = make_policy(cfg, sp).to(device)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    t = {k: torch.from_numpy(v) for k, v in rows.items()}
    history = []
    for step in range(steps):
        idx = torch.from_numpy(rng.integers(0, len(rows["sample"]), batch))
        mb = [t[k][idx].to(device) for k in ("images", "proprio", "tokens", "sample", "actions")]
        mb[-1] = mb[-1].reshape(batch, sp.chunk, sp.action_dim)
        loss = policy.bc_loss(*mb).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        history.append(float(loss.detach()))
    return policy, history


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlvla3.sft", description=__doc__.split("\n\n")[0])
    ap.add_argument("--demos", required=True, help="a collect run folder (or its shards/ folder)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps")
    ap.add_argument("--batch", type=int, default=64, help="rows per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    ap.add_argument("--out", default="sft.pt", help="the checkpoint to write (policy.init_from of the RL run)")
    ap.add_argument("overrides", nargs="*", help="config overrides: the RL run's env and policy")
    a = ap.parse_intermixed_args(argv)
    import torch

    from .launch import compose

    cfg = compose(a.overrides)
    if cfg.policy.chunk != 1:
        raise SystemExit(f"policy.chunk={cfg.policy.chunk}: SFT from one-step demonstration rows needs policy.chunk=1")
    torch.set_num_threads(cfg.policy.torch_threads)
    rows = load_demos(Path(a.demos))
    t0 = time.time()
    policy, hist = train(cfg, rows, a.steps, a.batch, a.lr, cfg.seed)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": policy.state_dict(), "sft": {"demos": str(a.demos), "rows": len(rows["sample"]),
                                                      "steps": a.steps, "loss": hist}}, out)
    k = max(1, len(hist) // 10)
    print(f"SFT {cfg.policy.name}: {len(rows['sample'])} demonstration rows, {a.steps} steps in {time.time() - t0:.0f}s; "
          f"loss {np.mean(hist[:k]):.3f} -> {np.mean(hist[-k:]):.3f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
