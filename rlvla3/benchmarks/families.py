"""`python -m rlvla3.bench families [--batches 1,8,32] [--families tiny,openvla,...] [--size tiny|published] [overrides...]`:
the Generator's forward and the Trainer's step per policy family and batch size."""
from __future__ import annotations

from ..cluster.compose import compose
from .common import chosen_families, median_seconds, save_rows

# The benchmark's runs of each family (registry.FAMILIES) as a user selects them (conf/policy/*.yaml), on the env of the overrides.
RELEASED = "policy.pretrained={released}"
RELEASED_OFT = "policy.pretrained={released_oft}"
FAMILY_RUNS = {
    "tiny": ["policy=tiny"],
    "tiny_chunk4": ["policy=tiny", "policy.chunk=4"],
    "openvla_parallel": ["policy=openvla"],
    "openvla_autoregressive": ["policy=openvla", "policy.decoding=autoregressive"],
    "openvla_oft_chunk4": ["policy=openvla", "policy.chunk=4"],
    "pi0_chunk4": ["policy=pi0"],
    "pi05_chunk4": ["policy=pi05"],
    "smolvla_chunk4": ["policy=smolvla"],
    "gr00t_chunk4": ["policy=gr00t"],
    # a released OpenVLA folder (a tiny one in the published layout, written for the run)
    "openvla_released": ["policy=openvla", "policy.decoding=autoregressive", RELEASED],
    "openvla_released_oft_chunk8": ["policy=openvla", "policy.chunk=8", RELEASED],
    "openvla_oft_l1_chunk8": ["policy=openvla_oft", "policy.chunk=8", RELEASED_OFT],
}


def tiny_released_folder(cfg, oft: bool = False, folder: str = "") -> str:
    """A tiny OpenVLA (or OpenVLA-OFT) folder in the released layout whose statistics fit the env
    of `cfg` (the last action dim is the gripper, left un-normalised as in OpenVLA's datasets), in
    `folder` or a new temporary one."""
    import tempfile

    from ..envs import env_dims
    from ..policies.openvla import oft as openvla_oft
    from ..policies.openvla import prismatic

    dims = env_dims(cfg)
    d, p = dims.action_dim, dims.proprio_dim
    stats = {"bench": {"action": {"q01": [-1.0] * d, "q99": [1.0] * d, "mask": [True] * (d - 1) + [False]},
                       "proprio": {"q01": [-1.0] * p, "q99": [1.0] * p}}}
    folder = folder or tempfile.mkdtemp(prefix="openvla-released-")
    if oft:
        openvla_oft.write_tiny_folder(folder, stats, d, p)
    else:
        prismatic.write_tiny_folder(folder, stats)
    return folder


def run(a) -> int:
    """Generator forward (`act`) and Trainer step (evaluate + PPO loss + backward + Adam) per
    policy family and batch size, one torch thread, medians of `--repeats` (after one warm-up).
    With policy.data_parallel=fsdp (the LIBERO presets: --size published) the step is FSDP's
    on one rank, in policy.compute_dtype."""
    import numpy as np
    import torch

    from ..algo import decoupled_ppo_loss
    from ..engine import fsdp
    from ..policies import make_policy
    from ..policies.base import pick_device
    from ..policies.lora import trainable
    from ..policies.sampling import draw_noise
    from ..world import spec

    torch.set_num_threads(1)
    published = a.size == "published"
    if published:
        from .memory import PUBLISHED_RUNS as runs
    else:
        runs = FAMILY_RUNS
    names = chosen_families(a.families, runs)
    rows = []
    folders = {"released": RELEASED, "released_oft": RELEASED_OFT}
    folders = {k: tiny_released_folder(compose(a.overrides), k == "released_oft") if any(o in runs[n] for n in names) else ""
               for k, o in folders.items()}
    print(f"{'family':28s} {'params':>9s} {'batch':>5s} {'act ms':>8s} {'train ms':>9s} {'act samples/s':>13s} {'peak GB':>8s}")
    for name in names:
        cfg = compose([*a.overrides, *(o.format(**folders) for o in runs[name])])
        sp = spec(cfg)
        device = pick_device(cfg.policy.device)
        if published and device.type != "cuda":
            raise SystemExit(f"--size published builds {name} at its released size (3.5-7.7 B parameters): it needs a GPU "
                             f"(policy.device={cfg.policy.device} gives {device}); on a CPU use the tiny families and "
                             "python -m rlvla3.bench memory")
        with torch.device(device):   # published: random weights made on the GPU, at the preset's LoRA and checkpointing
            policy = make_policy(cfg, sp, published=published).to(device).train()
        if cfg.policy.data_parallel == "fsdp":   # the Trainer's FSDP (one rank) and its compute dtype
            fsdp.one_rank_group(device)
            fsdp.shard(policy, device, cfg.policy.compute_dtype)
        opt = torch.optim.Adam(trainable(policy), lr=1e-5)
        n_params = sum(p.numel() for p in policy.parameters())
        for b in (int(x) for x in a.batches.split(",")):
            rng = np.random.default_rng(0)
            obs = tuple(torch.from_numpy(x).to(device) for x in (
                rng.integers(0, 255, (b, sp.cameras, sp.image_size, sp.image_size, 3), dtype=np.uint8),
                rng.normal(size=(b, sp.proprio_dim)).astype(np.float32),
                rng.integers(2, sp.vocab, (b, sp.instruction_len)).astype(np.int32)))
            noise = torch.from_numpy(draw_noise(sp.sample, rng, b)).to(device)

            def act():
                with torch.no_grad(), fsdp.autocast(device, cfg.policy.compute_dtype):
                    return policy.act(*obs, noise)

            sample, logp_b, _ = act()

            def train():
                with fsdp.autocast(device, cfg.policy.compute_dtype):
                    logp, ent, value = policy.evaluate(*obs, sample)
                z = torch.zeros(b, device=device)
                adv = torch.randn(b, device=device)
                decoupled_ppo_loss(logp, logp_b, logp_b, adv, value, z, ent, 0.2, 2.0, 0.5, 0.0).total.backward()
                opt.step()
                opt.zero_grad()

            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t_act, t_train = (median_seconds(f, a.repeats) for f in (act, train))
            peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")
            rows.append({"family": name, "size": a.size, "params": n_params, "batch": b, "act_s": t_act, "train_s": t_train,
                         "peak_gb": peak, "device": str(device)})
            print(f"{name:28s} {n_params / 1e6:8.2f}M {b:5d} {t_act * 1e3:8.1f} {t_train * 1e3:9.1f} {b / t_act:13.1f} "
                  f"{peak:8.1f}", flush=True)
    save_rows(a.out, "families.json" if not published else "families_published.json", rows)
    return 0


