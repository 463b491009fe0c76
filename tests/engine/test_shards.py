"""Shards on real zarr: atomic publish seen by a concurrent reader, bad shards moved aside, ledger."""
import json
import multiprocessing as mp
import time
import warnings
import zipfile

import numpy as np
import pytest

from rlvla3.engine import shards
from tests.conftest import replace_entry


def zarr_group(shard):
    """A published shard opened by zarr-python (a zip file: ZipStore)."""
    import zarr
    from zarr.storage import ZipStore

    return zarr.open_group(store=ZipStore(shard, mode="r"), mode="r")


def entry_names(shard) -> set[str]:
    with zipfile.ZipFile(shard) as zf:
        return set(zf.namelist())


def segment(T=8, N=3, fill=1):
    return {
        "images": np.full((T, N, 1, 8, 8, 3), fill, np.uint8),
        "proprio": np.full((T, N, 4), fill, np.float32),
        "tokens": np.full((T, N, 6), fill, np.int32),
        "sample": np.full((T, N, 2), fill, np.int32),
        "actions": np.full((T, N, 1, 2), fill, np.float32),
        "logprobs": np.full((T, N), fill, np.float32),
        "values": np.full((T, N), fill, np.float32),
        "rewards": np.full((T, N), fill, np.float32),
        "terminated": np.zeros((T, N), bool),
        "truncated": np.zeros((T, N), bool),
        "success": np.zeros((T, N), bool),
        "env_steps": np.ones((T, N), np.int16),
        "valid": np.ones((T, N), bool),
        "versions": np.full((T, N), 3, np.int32),
    }


def test_round_trip_and_attributes(tmp_path):
    seg = segment()
    name = shards.shard_name(2, 7, 11)
    shards.write_shard(tmp_path, name, seg, np.arange(3, dtype=np.float32), {"producer_rank": 4})
    arrays, attrs = shards.read_shard(tmp_path / name)
    for k, v in seg.items():
        np.testing.assert_array_equal(arrays[k], v)
    np.testing.assert_array_equal(arrays["bootstrap"], [0, 1, 2])
    assert attrs["schema_version"] == shards.SCHEMA_VERSION and attrs["rows"] == 24
    assert attrs["min_version"] == 3 and attrs["producer_rank"] == 4
    assert shards.parse_name(name) == (2, 7, 11)
    assert shards.scan(tmp_path) == [name]


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_shards_are_plain_zarr_3_both_ways(tmp_path, codec):
    """What write_shard writes, zarr-python reads (the same arrays, the group's attributes); a
    shard zarr-python wrote (nested chunk keys, chunks of fill values skipped), read_shard reads."""
    import zarr

    from rlvla3.benchmarks.shards import zarr_python_write

    rng = np.random.default_rng(0)
    seg = {k: (rng.integers(0, 200, v.shape) if v.dtype != bool else rng.random(v.shape) < 0.5).astype(v.dtype)
           for k, v in segment().items()}
    seg["terminated"][:] = False   # all fill value: zarr-python writes no chunk for it
    mine = shards.write_shard(tmp_path, shards.shard_name(0, 0, 0), seg, np.ones(3, np.float32), {"x": 1}, codec)
    assert mine.is_file(), "a shard is one file"
    root = zarr_group(mine)
    assert root.attrs["x"] == 1 and root.attrs["schema_version"] == shards.SCHEMA_VERSION
    for k, v in seg.items():
        np.testing.assert_array_equal(root[k][...], v)
    theirs = tmp_path / shards.shard_name(0, 0, 1)
    zarr_python_write(theirs, seg, np.ones(3, np.float32))
    root = zarr.open_group(str(theirs), mode="a")
    root.attrs.update(shards.read_attrs(mine))
    arrays, _ = shards.read_shard(theirs)
    for k, v in seg.items():
        np.testing.assert_array_equal(arrays[k], v)
    assert not any((theirs / "terminated").rglob("c*")), "zarr-python skipped the all-fill chunk"
    # zarr-python's own zip store (nested chunk keys, its own entry order and timestamps)
    from zarr.codecs import ZstdCodec
    from zarr.storage import ZipStore

    zipped = tmp_path / shards.shard_name(0, 0, 2)
    store = ZipStore(zipped, mode="w")
    root = zarr.create_group(store=store, attributes=shards.read_attrs(mine))
    for k, v in {**seg, "bootstrap": np.ones(3, np.float32)}.items():
        root.create_array(k, data=v, chunks=v.shape, compressors=ZstdCodec(level=1))
    store.close()
    arrays, _ = shards.read_shard(zipped)
    for k, v in seg.items():
        np.testing.assert_array_equal(arrays[k], v)


def test_zstd_is_spent_only_where_it_shrinks_and_fill_chunks_are_not_written(tmp_path):
    """Under codec zstd an array zstd cannot shrink (noise frames) is written raw and one it can
    (flat frames) compressed, each array's zarr.json saying which; an all-fill chunk is not
    written. read_shard and zarr-python read every array back exactly."""
    rng = np.random.default_rng(0)
    seg = segment()
    seg["images"] = rng.integers(0, 256, (8, 3, 2, 64, 64, 3), dtype=np.uint8)   # 590 KB of noise
    seg["proprio"] = np.zeros((8, 3, 4), np.float32)
    flat = np.full((8, 3, 2, 64, 64, 3), 7, np.uint8)
    path = shards.write_shard(tmp_path, shards.shard_name(0, 0, 0), seg, np.ones(3, np.float32), {})
    flat_path = shards.write_shard(tmp_path, shards.shard_name(0, 0, 1), {**seg, "images": flat}, np.ones(3, np.float32), {})
    def codecs(p, k):
        with zipfile.ZipFile(p) as zf:
            return [c["name"] for c in json.loads(zf.read(f"{k}/zarr.json"))["codecs"]]
    assert codecs(path, "images") == ["bytes"], "noise was compressed"
    assert codecs(flat_path, "images") == ["bytes", "zstd"], "flat frames were not compressed"
    assert "proprio/c.0.0.0" not in entry_names(path) and "rewards/c.0.0" in entry_names(path)
    for p, images in ((path, seg["images"]), (flat_path, flat)):
        arrays, _ = shards.read_shard(p)
        root = zarr_group(p)
        for k, v in {**seg, "images": images}.items():
            np.testing.assert_array_equal(arrays[k], v)
            np.testing.assert_array_equal(root[k][...], v)


@pytest.mark.parametrize("large", [False, True])
def test_the_zip_writer_writes_archives_zipfile_verifies(tmp_path, large):
    """The shard writer's own zip (and the zipfile path it takes for zip64-sized shards): every
    entry's CRC-32 checks out in zipfile, and both readers return the bytes written."""
    rng = np.random.default_rng(0)
    entries = {"zarr.json": b'{"a": 1}', "images/c.0.0": rng.integers(0, 256, 300_001, dtype=np.uint8),
               "empty": b"", "rewards/c.0": rng.normal(size=(7, 3)).astype(np.float32)}
    w = shards.ZipWriter(tmp_path / "z", large=large)
    for name, data in entries.items():
        w.add(name, data)
    w.close()
    with zipfile.ZipFile(tmp_path / "z") as zf:
        assert zf.testzip() is None, "a CRC does not match its entry"
        assert zf.namelist() == list(entries)
        for name, data in entries.items():
            assert zf.read(name) == bytes(memoryview(data).cast("B"))
    with shards.ZipEntries(tmp_path / "z") as src:
        for name, data in entries.items():
            assert src.read(name) == bytes(memoryview(data).cast("B"))


def _writer(d, n):
    for i in range(n):
        shards.write_shard(d, shards.shard_name(0, 0, i), segment(T=16, N=4, fill=i % 250 + 1),
                           np.zeros(4, np.float32), {})


def test_concurrent_reader_never_sees_a_partial_shard(tmp_path):
    n = 25
    p = mp.get_context("spawn").Process(target=_writer, args=(tmp_path, n))
    p.start()
    seen, deadline = set(), time.monotonic() + 120
    while len(seen) < n and time.monotonic() < deadline:
        for name in shards.scan(tmp_path):
            if name in seen:
                continue
            arrays, _ = shards.read_shard(tmp_path / name)   # raises on any missing chunk
            fill = shards.parse_name(name)[2] % 250 + 1
            assert (arrays["images"] == fill).all(), f"torn read of {name}"
            assert (arrays["rewards"] == fill).all()
            seen.add(name)
    p.join(timeout=30)
    assert p.exitcode == 0 and len(seen) == n


def test_corrupt_and_wrong_schema_shards_are_quarantined(tmp_path):
    good = shards.shard_name(0, 0, 0)
    shards.write_shard(tmp_path, good, segment(), np.zeros(3, np.float32), {})
    # corrupt one chunk
    bad = shards.shard_name(0, 0, 1)
    shards.write_shard(tmp_path, bad, segment(), np.zeros(3, np.float32), {})
    replace_entry(tmp_path / bad, "images/c.0.0.0.0.0.0", b"not zstd")
    with pytest.raises(shards.ShardError, match=bad):
        shards.read_shard(tmp_path / bad)
    # a truncated file (a copy cut short)
    cut = shards.shard_name(0, 0, 3)
    whole = shards.write_shard(tmp_path, cut, segment(), np.zeros(3, np.float32), {}).read_bytes()
    (tmp_path / cut).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(shards.ShardError, match=cut):
        shards.read_shard(tmp_path / cut)
    with pytest.raises(shards.ShardError, match=cut):
        shards.read_attrs(tmp_path / cut)
    # wrong schema version
    old = shards.shard_name(0, 0, 2)
    shards.write_shard(tmp_path, old, segment(), np.zeros(3, np.float32), {})
    j = json.loads(zipfile.ZipFile(tmp_path / old).read("zarr.json"))
    j["attributes"]["schema_version"] = 99
    replace_entry(tmp_path / old, "zarr.json", json.dumps(j).encode())
    with pytest.raises(shards.ShardError, match="schema_version"):
        shards.read_shard(tmp_path / old)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        shards.quarantine(tmp_path / bad, "test")
        shards.quarantine(tmp_path / cut, "test")
    assert any("skipping shard" in str(x.message) for x in w)
    assert shards.scan(tmp_path) == [good, old]
    assert len(list((tmp_path / shards.BAD_DIR).iterdir())) == 2   # moved aside, not deleted


def test_partial_temporaries_are_invisible_and_cleaned(tmp_path):
    (tmp_path / ".tmp-s000000-g00000-q000000-123").mkdir()        # the older folder layout
    (tmp_path / ".tmp-s000000-g00000-q000001-123").write_bytes(b"PK")   # a file cut short by a crash
    assert shards.scan(tmp_path) == []
    assert shards.clean_partial(tmp_path) == 2
    assert not any(tmp_path.iterdir())


def test_ledger_only_moves_forward():
    led = shards.Ledger.empty()
    led.advance("a", 10)
    led.advance("a", 16)
    assert led.total() == 16
    with pytest.raises(ValueError, match="move back"):
        led.advance("a", 5)
    assert shards.Ledger.from_state(led.to_state()).rows == {"a": 16}


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs: a real full disk (root can mount one; elsewhere the test says why it skips)."""
    import subprocess

    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk test needs a real full disk")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_a_full_disk_is_named_and_keeps_the_previous_checkpoint(tiny_disk):
    """torch reports a full disk as `[enforce fail at inline_container.cc] unexpected pos`: the
    checkpoint error now says "no space left on <folder>", and the checkpoint before survives."""
    import torch

    from rlvla3.engine import checkpoints

    def save(state, path):
        torch.save(state, path)

    good = checkpoints.publish(save, {"w": torch.zeros(1000)}, tiny_disk / "v000001.pt")
    with pytest.raises(checkpoints.CheckpointError, match=f"no space left on {tiny_disk}"):
        checkpoints.publish(save, {"w": torch.zeros(4_000_000)}, tiny_disk / "v000002.pt")
    assert checkpoints.load_torch(good)["w"].shape == (1000,)
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["v000001.pt"]
