"""Packed buffers and control messages round-trip, including over a real mpiexec."""
import pickle
import subprocess
import sys
import textwrap

import numpy as np

from rlvla3.config import PolicyConfig
from rlvla3.engine.protocol import ShardReady, Slice, TrainOrder, WeightsHeader, obs_codec
from rlvla3.policies import sample_layout
from rlvla3.world import Spec as EnvSpec
from tests.conftest import needs_mpi

SPEC = EnvSpec(cameras=2, image_size=8, proprio_dim=5, action_dim=7, instruction_len=6, vocab=64,
               sample=sample_layout(PolicyConfig(), 7))


def test_obs_codec_round_trip_is_exact_and_aligned():
    c = obs_codec(SPEC)
    rng = np.random.default_rng(0)
    arrays = {"images": rng.integers(0, 255, (3, 2, 8, 8, 3), dtype=np.uint8),
              "proprio": rng.normal(size=(3, 5)).astype(np.float32),
              "tokens": rng.integers(0, 64, (3, 6), dtype=np.int32)}
    buf = c.alloc(3)
    c.pack(buf, (4, 5, 6, 1), arrays)
    assert c.header(buf) == (4, 5, 6, 1)
    out = c.unpack(buf, 3)
    for k in arrays:
        np.testing.assert_array_equal(out[k], arrays[k])
    assert all(v.ctypes.data % 8 == 0 for v in out.values())


def test_control_messages_pickle():
    msgs = [ShardReady("s000001-g00002-q000003", 2, 3, 1, 64, 0, 1, 64, 2, 1, 1.5, 0, 4),
            WeightsHeader(3, 4, 1000), TrainOrder(1, 2, (Slice("x", 0, 5, 1),), end_of_version=True)]
    for m in msgs:
        assert pickle.loads(pickle.dumps(m)) == m


ECHO = textwrap.dedent("""
    import numpy as np
    from mpi4py import MPI
    from rlvla3.config import PolicyConfig
    from rlvla3.world import Spec as EnvSpec
    from rlvla3.policies import sample_layout
    from rlvla3.engine.protocol import Tag, ShardReady, action_codec
    comm = MPI.COMM_WORLD
    spec = EnvSpec(1, 8, 3, 7, 4, 32, sample_layout(PolicyConfig(chunk=2), 7))
    c = action_codec(spec)
    if comm.rank == 0:
        buf = c.alloc(4)
        arrays = {"action": np.linspace(-1, 1, 56, dtype=np.float32).reshape(4, 2, 7),
                  "sample": np.arange(56, dtype=np.int32).reshape(4, 14),
                  "logprob": np.array([-1, -2, -3, -4], np.float32), "value": np.ones(4, np.float32)}
        c.pack(buf, (9, 8, 7, 0), arrays)
        comm.Send(buf, dest=1, tag=Tag.ACTION + 9)
        comm.send(ShardReady("n", 1, 2, 3, 4, 5, 6, 4), dest=1, tag=Tag.SHARD_READY)
        back = np.empty_like(buf)
        comm.Recv(back, source=1, tag=Tag.ACTION + 9)
        msg = comm.recv(source=1, tag=Tag.SHARD_READY)
        assert (back == buf).all() and msg.name == "n" and msg.max_version == 6
        print("ROUNDTRIP OK")
    else:
        buf = c.alloc(4)
        comm.Recv(buf, source=0, tag=Tag.ACTION + 9)
        msg = comm.recv(source=0, tag=Tag.SHARD_READY)
        comm.Send(buf, dest=0, tag=Tag.ACTION + 9)
        comm.send(msg, dest=0, tag=Tag.SHARD_READY)
""")


@needs_mpi
def test_messages_round_trip_over_mpiexec(tmp_path):
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    out = subprocess.run(["mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", "2", sys.executable, "-m", "mpi4py",
                          str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ROUNDTRIP OK" in out.stdout


def test_take_rows_balances_trainers_to_the_row():
    from rlvla3.engine.row_plan import take_rows

    order = [("a", 5), ("b", 5), ("c", 5)]
    slices, cursor = take_rows(order, (0, 2), 9, 2)
    per = {0: 0, 1: 0}
    for s in slices:
        per[s.owner] += s.stop - s.start
    assert per == {0: 4, 1: 5} and cursor == (2, 1)
    covered = [(s.name, r) for s in slices for r in range(s.start, s.stop)]
    assert covered == [("a", 2), ("a", 3), ("a", 4)] + [("b", r) for r in range(5)] + [("c", 0)]
    # Fewer rows than Trainers left: the rest own nothing this step; the order is exhausted.
    slices, cursor = take_rows([("a", 2)], (0, 0), 9, 3)
    assert [(s.start, s.stop, s.owner) for s in slices] == [(0, 2, 0)] and cursor == (1, 0)
