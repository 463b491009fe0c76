"""`python -m rlvla3.openloop --checkpoint sft.pt --demos DIR [overrides...]`: what a cloned
policy acts on. Its greedy action chunks on demonstration rows against the expert's, per action
dimension, three ways:

    own rows             each row as recorded
    images of others     each row's images replaced by another row's (state and prompt kept)
    state of others      each row's proprio and prompt replaced by another row's (images kept;
                         demonstrations of several tasks swap the instruction with it)

An input the policy reads raises its error when it is another row's; one it ignores leaves the
error unchanged. A small open-loop error says nothing of the closed loop: a random-initialised
π0.5 cloned LIBERO's demonstrations as closely as the tiny VLA, from the state in its prompt
alone, and failed 49 of 50 episodes (docs/results/libero.md).

    python -m rlvla3.openloop --checkpoint runs/recipe/sft.pt --demos runs/recipe/demos +experiment=libero_object_grpo policy=pi05
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

BATCH = 64


def other_rows(n: int, rng) -> np.ndarray:
    """A permutation of n rows that moves every row (a shuffle rotated past its fixed points)."""
    if n < 2:
        raise SystemExit(f"{n} demonstration row(s): swapping inputs needs at least 2")
    perm = rng.permutation(n)
    return perm[(np.argsort(perm) + 1) % n]   # row i takes the row after i in the shuffled order


def greedy_chunks(actor, layout, obs: dict[str, np.ndarray], seed: int) -> np.ndarray:
    """The policy's greedy env actions [n, K, D] for observations `obs` (sampling.greedy_noise)."""
    from ..policies.sampling import draw_noise, greedy_noise

    n = len(obs["proprio"])
    noise = greedy_noise(layout, draw_noise(layout, np.random.default_rng(seed), n))
    out = []
    for i in range(0, n, BATCH):
        sample, _, _ = actor.act({k: v[i:i + BATCH] for k, v in obs.items()}, noise[i:i + BATCH])
        out.append(actor.to_env_action(sample))
    return np.concatenate(out).reshape(n, layout.chunk, layout.action_dim)


def ablations(rows: dict[str, np.ndarray], idx: np.ndarray, others: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """The observations of rows `idx` as recorded and with one input taken from rows `others`."""
    own = {k: rows[k][idx] for k in ("images", "proprio", "tokens")}
    return {"own rows": own,
            "images of others": {**own, "images": rows["images"][others]},
            "state of others": {**own, "proprio": rows["proprio"][others], "tokens": rows["tokens"][others]}}


def open_loop_errors(cfg, checkpoint: str, rows: dict[str, np.ndarray], n_rows: int, seed: int) -> dict[str, np.ndarray]:
    """Mean |greedy action - expert action| per action dimension for each ablation, over `n_rows`
    rows drawn from `rows` (the same rows and noise for all three)."""
    from ..engine.torch_learner import load_init
    from ..policies import make_actor
    from ..world import spec

    sp = spec(cfg)
    actor = make_actor(cfg, sp)   # a Generator's: the policy on policy.device
    load_init(actor.policy, checkpoint)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(rows["actions"]), min(n_rows, len(rows["actions"])), replace=False)
    others = idx[other_rows(len(idx), rng)]
    expert = rows["actions"][idx]
    return {name: np.abs(greedy_chunks(actor, sp.sample, obs, seed) - expert).mean(axis=(0, 1))
            for name, obs in ablations(rows, idx, others).items()}


def parser() -> argparse.ArgumentParser:
    """The command's options (also read by tests/house/test_docs.py to check documented commands)."""
    ap = argparse.ArgumentParser(prog="python -m rlvla3.openloop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a .pt checkpoint (rlvla3.sft output or a run's ckpt/)")
    ap.add_argument("--demos", required=True, help="a collect run folder (or its shards/ folder), or a LeRobotDataset folder")
    ap.add_argument("--rows", type=int, default=384, help="demonstration rows to compare on")
    ap.add_argument("--seed", type=int, default=0, help="which rows, which swaps, the chain's start noise")
    ap.add_argument("overrides", nargs="*", help="config overrides: the checkpoint's env and policy")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_intermixed_args(argv)
    from ..cluster.compose import compose
    from ..engine.checkpoints import exists
    from .sft import load_rows

    if a.rows < 2:
        raise SystemExit(f"--rows {a.rows}: give at least 2 (inputs are swapped between rows)")
    if not exists(a.checkpoint):   # before the demonstrations load (LIBERO's: hundreds of MB)
        raise SystemExit(f"--checkpoint {a.checkpoint}: no such checkpoint (an rlvla3.sft output or a run's ckpt/v*.pt "
                         "or ckpt/v*.dcp)")
    cfg = compose(a.overrides)
    if cfg.policy.name == "emulated":
        raise SystemExit("policy=emulated has no weights to act with: give the checkpoint's policy (e.g. policy=pi05)")
    rows = load_rows(Path(a.demos), cfg, {})
    errors = open_loop_errors(cfg, a.checkpoint, rows, a.rows, a.seed)
    dims = len(next(iter(errors.values())))
    print(f"{cfg.policy.name}, {min(a.rows, len(rows['actions']))} demonstration rows, greedy: mean |a - expert| per action dim")
    print(f"{'':18s}" + "".join(f"{f'dim {d}':>8s}" for d in range(dims)) + f"{'mean':>8s}")
    for name, e in errors.items():
        print(f"{name:18s}" + "".join(f"{v:8.3f}" for v in e) + f"{e.mean():8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
