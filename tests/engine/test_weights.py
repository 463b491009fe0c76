"""Weight sync at size: wire formats, buckets, and a real MPI publish to several Generators."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rlvla3.cluster.local import mpi_env
from rlvla3.engine.weights import buckets, from_wire, to_wire
from tests.conftest import needs_mpi


def test_bfloat16_wire_rounds_to_nearest_even_within_2_to_the_minus_8():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 10.0
    back = np.empty_like(x)
    from_wire(to_wire(x, "bfloat16"), back)
    rel = np.abs(back - x) / np.abs(x)
    assert rel.max() <= 2.0 ** -8 and rel.max() > 0
    # Exact cases: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 and goes to the even one (1.0).
    ties = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.0], np.float32)
    from_wire(to_wire(ties, "bfloat16"), back[:3])
    assert back[:3].tolist() == [1.0, 1.0 + 2.0 ** -6, -2.0]
    same = np.empty_like(x)
    from_wire(to_wire(x, "float32"), same)
    assert np.array_equal(same, x)
    with pytest.raises(ValueError, match="float16"):
        to_wire(x, "float16")


def test_torch_and_numpy_bfloat16_agree_bit_for_bit():
    from rlvla3.engine.weights import bf16_bits_numpy, bf16_bits_torch

    x = np.random.default_rng(1).standard_normal(200_001).astype(np.float32) * 1e3
    x[:3] = [1.0 + 2.0 ** -8, -0.0, 3.0e38]
    assert np.array_equal(bf16_bits_numpy(x), bf16_bits_torch(x))


def test_buckets_cover_the_buffer_once_and_respect_the_size():
    sl = buckets(1_000_003, 4, 1.0)  # 1 MiB of float32 = 262144 values per bucket
    assert sl[0] == slice(0, 262144) and sl[-1].stop == 1_000_003
    assert all(a.stop == b.start for a, b in zip(sl, sl[1:]))
    assert max(s.stop - s.start for s in sl) == 262144 and len(buckets(5, 2, 1.0)) == 1


def test_the_relay_tree_reaches_every_generator_once():
    from rlvla3.world import relay_tree

    for n, fanout in ((1, 2), (5, 2), (16, 2), (4, 1), (7, 3), (6, 0)):
        tree = relay_tree(n, fanout)
        children = [c for _, kids in tree for c in kids]
        assert sorted(children) == list(range(1, n + 1)), "every Generator has exactly one parent"
        assert all(tree[c][0] == p for p, (_, kids) in enumerate(tree) for c in kids)
        assert all(len(kids) <= (fanout or n) for _, kids in tree)
    assert relay_tree(16, 2)[0][1] == [1, 2] and relay_tree(6, 0)[0][1] == [1, 2, 3, 4, 5, 6]


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("method,fanout", [("relay", 0), ("relay", 1), ("relay", 2), ("ibcast", -1)])
def test_a_publish_reaches_every_generator_exactly(tmp_path, method, fanout):
    """rank 0 publishes 300k parameters in 0.25 MiB buckets to 3 Generators over real mpiexec,
    sent to each (fanout 0) or relayed down a chain (1) or a binary tree (2), or broadcast by
    MPI's Ibcast (the benchmark's comparison); float32 arrives bit-exact (the worker checks),
    bfloat16 within 2^-8."""
    cmd = ["mpiexec", "--oversubscribe", "-n", "4", sys.executable, "-m", "mpi4py", "-m", "rlvla3.benchmarks.weights",
           "300000", "float32,bfloat16", "0.25", "1", str(fanout), method]
    if __import__("os").geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    out = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(r["dtype"], r["generators"], r["method"]) for r in rows] == [("float32", 3, method), ("bfloat16", 3, method)]
    assert rows[0]["max_rel_error"] == 0.0 and 0 < rows[1]["max_rel_error"] <= 2.0 ** -8
    assert rows[0]["bytes_per_generator"] == 2 * rows[1]["bytes_per_generator"] == 1_200_000


def test_the_benchmark_runs_one_job_per_generator_count_method_and_fanout():
    from rlvla3.benchmarks.weights import publish_points

    assert publish_points("1,4", "relay,ibcast", "0,2") == [(1, "relay", 0), (4, "relay", 0), (4, "relay", 2), (4, "ibcast", -1)]
    with pytest.raises(SystemExit, match="'nccl' is not one of relay, ibcast"):
        publish_points("4", "relay,nccl", "0")
