"""`python -m rlvla3.bench obs`: what observation compression (runtime.obs_compression) costs and
saves per request, on frames robosuite renders (Lift, env i from seed i under random actions, as
a Simulator sends them: one group's request per step).

Per mode: wire bytes per request against the raw buffer, the Simulator's encode and the
Generator's decode CPU per request (medians), and the link bandwidth below which it pays: the
bytes saved take longer to send than the codec takes, (raw - wire) / (encode + decode). On one
node MPI moves the raw buffer through shared memory at several GB/s, far above that: the default
is none.
"""
from __future__ import annotations

import time

import numpy as np

from ..config import OBS_COMPRESSIONS
from ..engine.obs_compression import ObsWire
from ..engine.protocol import obs_codec
from ..world import spec
from .common import save_rows
from .shards import rendered_images


def run(a) -> int:
    from ..cluster.compose import compose

    cfg = compose(["env=robosuite_lift", "env.image_size=128", "env.cameras=[agentview,robot0_eye_in_hand]",
                   "env.num_envs=4", *a.overrides])
    T, n = cfg.algo.segment_steps, cfg.env.num_envs
    images = rendered_images(cfg, T, n)
    sp = spec(cfg)
    codec = obs_codec(sp)
    buf, out = codec.alloc(n), codec.alloc(n)
    rest = {"proprio": np.zeros((n, sp.proprio_dim), np.float32), "tokens": np.zeros((n, sp.instruction_len), np.int32)}
    rows = []
    print(f"request: {n} envs x {len(cfg.env.cameras)} cameras at {cfg.env.image_size}^2, {T} consecutive steps, "
          f"{buf.nbytes / 1e3:.0f} KB raw")
    print(f"{'mode':10s} {'KB/request':>10s} {'of raw':>7s} {'encode ms':>9s} {'decode ms':>9s} {'pays below MB/s':>15s}")
    for mode in OBS_COMPRESSIONS:
        sizes, enc, dec = [], [], []
        for _ in range(a.repeats):
            send = receive = None
            if mode != "none":   # fresh ends each repeat: the first frame is sent whole, as after a start
                send, receive = ObsWire(mode, codec, n), ObsWire(mode, codec, n)
            for t in range(T):
                codec.pack(buf, (0, t, 0, 0), {"images": images[t], **rest})
                if send is None:
                    sizes.append(buf.nbytes)
                    continue
                c0 = time.process_time()
                wire = send.encode(buf)
                c1 = time.process_time()
                receive.decode(wire, out)
                c2 = time.process_time()
                if not np.array_equal(out, buf):
                    raise RuntimeError(f"{mode}: step {t} decoded to another buffer than was sent")
                sizes.append(wire.nbytes)
                enc.append(c1 - c0)
                dec.append(c2 - c1)
        kb = float(np.mean(sizes)) / 1e3
        e, d = (float(np.median(x)) * 1e3 if x else 0.0 for x in (enc, dec))
        saved_mb = (buf.nbytes / 1e3 - kb) / 1e3
        pays = saved_mb / ((e + d) / 1e3) if e + d > 0 else float("nan")
        rows.append({"mode": mode, "raw_kb": buf.nbytes / 1e3, "wire_kb": kb, "encode_ms": e, "decode_ms": d,
                     "pays_below_mb_per_s": pays})
        print(f"{mode:10s} {kb:10.1f} {kb / (buf.nbytes / 1e3):7.0%} {e:9.2f} {d:9.2f} {pays:15.0f}", flush=True)
    save_rows(a.out, "obs.json", rows)
    return 0
