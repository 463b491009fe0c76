"""Observation compression (runtime.obs_compression): bit-exact frames on both ends of the request
path, delta state kept in step, and fewer bytes on frames that change little."""
from __future__ import annotations

import numpy as np
import pytest

from rlvla3.cluster.compose import compose
from rlvla3.engine.generator import Generator
from rlvla3.engine.inprocess import InProcessRun
from rlvla3.engine.obs_compression import ObsWire
from rlvla3.engine.protocol import obs_codec
from rlvla3.engine.simulator import GroupState, Simulator
from rlvla3.world import spec
from tests.conftest import TOY


def frames(n: int, steps: int, size: int = 64) -> list[np.ndarray]:
    """A moving square on a fixed background, per env: what consecutive rendered frames look like."""
    rng = np.random.default_rng(0)
    background = rng.integers(0, 255, (n, 1, size, size, 3), dtype=np.uint8)
    out = []
    for t in range(steps):
        f = background.copy()
        f[:, :, 10 + t % 40:20 + t % 40, 10:20] = 255
        out.append(f)
    return out


@pytest.mark.parametrize("mode", ["lz4", "delta-lz4"])
def test_every_buffer_arrives_bit_exact_and_delta_shrinks_the_wire(mode):
    cfg = compose([*TOY, "env.image_size=64"])
    codec, n = obs_codec(spec(cfg)), 3
    sender, receiver = ObsWire(mode, codec, n), ObsWire(mode, codec, n)
    buf, got = codec.alloc(n), codec.alloc(n)
    sizes = []
    for t, images in enumerate(frames(n, 30)):
        sp = spec(cfg)
        codec.pack(buf, (1, t, 0, 0), {"images": images, "proprio": np.full((n, sp.proprio_dim), t, np.float32),
                                       "tokens": np.full((n, sp.instruction_len), t, np.int32)})
        wire = sender.encode(buf)
        sizes.append(wire.nbytes)
        receiver.decode(wire.copy(), got)
        assert np.array_equal(got, buf), f"step {t}: the decoded buffer differs from the sent one"
    raw = images.nbytes
    if mode == "delta-lz4":
        assert max(sizes[1:]) < 0.2 * raw, (sizes, raw)   # only the square moved: the XOR is mostly zeros
    else:
        assert sizes[0] > 0.8 * raw, (sizes, raw)         # a noise background does not compress


def test_the_generator_sees_exactly_what_the_simulator_sent_through_the_engine(tmp_path):
    cfg = compose([*TOY, "runtime.obs_compression=delta-lz4", "algo.max_versions=2"])
    run = InProcessRun(cfg, tmp_path)
    sim, gen = run.role(Simulator), run.role(Generator)
    compared = []

    def check(r):
        for g in sim.groups:
            sent = g.obs_buf
            got = gen.recv_bufs[g.g.gid]
            if g.state in (GroupState.WAIT_ACTION, GroupState.WAIT_BOOTSTRAP) and \
                    gen.obs_codec.header(got) == sim.ctx.obs_codec.header(sent):
                assert np.array_equal(got, sent), f"group {g.g.gid}: the Generator decoded another buffer than was sent"
                compared.append(g.g.gid)

    run.run(timeout=240, check=check)
    assert len(compared) > 20 and len(set(compared)) == len(sim.groups), compared[:10]


@pytest.mark.sim
def test_bench_obs_measures_every_mode_on_rendered_frames(tmp_path):
    import json

    from rlvla3.benchmarks.cli import main

    assert main(["obs", "--repeats", "1", "--out", str(tmp_path), "algo.segment_steps=6", "env.num_envs=2"]) == 0
    rows = {r["mode"]: r for r in json.loads((tmp_path / "obs.json").read_text())}
    assert set(rows) == {"none", "lz4", "delta-lz4"}
    assert rows["none"]["wire_kb"] == rows["none"]["raw_kb"]
    assert rows["delta-lz4"]["wire_kb"] < rows["lz4"]["wire_kb"] < rows["none"]["raw_kb"], rows   # renders change little
    assert rows["delta-lz4"]["encode_ms"] > 0 and rows["delta-lz4"]["pays_below_mb_per_s"] > 0
