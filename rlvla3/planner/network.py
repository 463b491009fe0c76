"""The site in the planner's models: weight broadcast down the relay tree, requests crossing the
network, a Generator's message rate, and shards through the shared filesystem.

A profile's site fields (profile.SITE_FIELDS, 0 = not modelled) turn into the costs both models
already have, for one layout (`effective`): the analytic model and the DES read the same
effective profile, so they stay one account of the engine.

- weight broadcast (`broadcast_ms`), as the engine publishes (world.relay_tree,
  generator.weights_fanout): a node forwards each bucket to its children as soon as it has
  landed, so a publish takes about fanout x weights / link bandwidth at the top, plus one bucket
  per further level, plus a latency per level; with fanout 0 Trainer 0 sends every Generator the
  whole buffer itself. All links together cannot beat net_bisection_gbps. Added to weight_sync_ms.
- a request crosses the network twice (added to request_overhead_ms), and a Generator spends
  message_us of CPU on it in the same loop as its forwards (added to the forward's per-sample
  cost, a request being group_size samples): this is what caps one Generator's request rate.
- shards: a segment's bytes at a Simulator's share of the filesystem are added to
  shard_delay_ms; the Trainers read every sample back at their share, which slows training
  (train_samples_per_s), since the Trainer reads on its own loop.
"""
from __future__ import annotations

import dataclasses

from ..config import GeneratorConfig
from .layout import SEGMENT_STEPS, Layout, layout_sharding
from .profile import MS_PER_S, SITE_FIELDS, Profile

WEIGHTS_FANOUT = GeneratorConfig().weights_fanout
"""The engine's default relay tree fanout (generator.weights_fanout): what a plan runs with."""
BUCKET_MB = GeneratorConfig().weights_bucket_mb * 2**20 / 1e6
"""The engine's default bucket (generator.weights_bucket_mb, MiB), in MB."""


def ideal(profile: Profile) -> Profile:
    """The profile without its site terms (every link and disk infinitely fast)."""
    return dataclasses.replace(profile, **{f: 0.0 for f in SITE_FIELDS})


def has_site(profile: Profile) -> bool:
    return any(getattr(profile, f) for f in SITE_FIELDS)


def relay_depth(gens: int, fanout: int) -> int:
    """Levels of the relay tree below Trainer 0 (world.relay_tree's numbering: node i's parent is
    (i - 1) // fanout; the deepest Generator is the last)."""
    if gens <= 0:
        return 0
    if fanout == 0:
        return 1
    depth, node = 0, gens
    while node:
        node = (node - 1) // fanout
        depth += 1
    return depth


def broadcast_ms(profile: Profile, gens: int, fanout: int = WEIGHTS_FANOUT, bucket_mb: float = BUCKET_MB) -> float:
    """Milliseconds to deliver one publish of profile.weights_mb to `gens` Generators (0 when the
    profile gives no weights size or bandwidth)."""
    if not (profile.weights_mb and profile.net_gbps) or gens <= 0:
        return 0.0
    mb_per_ms = profile.net_gbps * 1e3 / MS_PER_S          # GB/s -> MB/ms
    lat = profile.net_latency_us / 1e3
    whole = profile.weights_mb / mb_per_ms                 # one buffer over one link
    bucket = min(bucket_mb, profile.weights_mb) / mb_per_ms
    if fanout == 0 or gens <= fanout:
        tree = min(gens, fanout or gens) * whole + lat
    else:
        depth = relay_depth(gens, fanout)
        tree = fanout * whole + (depth - 1) * fanout * bucket + depth * lat
    if profile.net_bisection_gbps:
        tree = max(tree, gens * profile.weights_mb / (profile.net_bisection_gbps * 1e3 / MS_PER_S))
    return tree


def effective(profile: Profile, layout: Layout) -> Profile:
    """The profile with the site's costs for this layout folded into the engine's terms."""
    if not has_site(profile):
        return profile
    p = profile
    request = 2 * p.net_latency_us / 1e3
    shard_ms, train_sps = 0.0, p.train_samples_per_s
    if p.fs_mbps and p.sample_kb:
        sims = max(len(layout_sharding(p, layout)), 1)
        segment_mb = SEGMENT_STEPS * layout.group_size * p.sample_kb / 1e3
        shard_ms = segment_mb / (p.fs_mbps / sims) * MS_PER_S
        read_s_per_sample = p.sample_kb / 1e3 / (p.fs_mbps / layout.train_gpus)
        train_sps = 1.0 / (1.0 / p.train_samples_per_s + read_s_per_sample)
    return dataclasses.replace(
        p, weight_sync_ms=p.weight_sync_ms + broadcast_ms(p, layout.gen_gpus),
        request_overhead_ms=p.request_overhead_ms + request, shard_delay_ms=p.shard_delay_ms + shard_ms,
        infer_per_sample_ms=p.infer_per_sample_ms + p.message_us / 1e3 / layout.group_size,
        train_samples_per_s=train_sps, **{f: 0.0 for f in SITE_FIELDS})

