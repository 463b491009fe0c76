"""A checkpoint of a model sharded over Trainer ranks (policy.data_parallel=fsdp): a folder
`ckpt/v000012.dcp/` that every Trainer rank writes its part of through torch.distributed.checkpoint
(DCP), beside Trainer 0's counters in `trainer.pt`.

Why DCP rather than one file: each rank writes only the shards it holds, in parallel with the
others, and no rank ever holds the whole model and Adam state (a full fine-tuning of OpenVLA-7B
gathered to one rank would need ~90 GB of its host memory); and a folder written by N ranks loads
into M (DCP reshards as it reads: a resume with another Trainer count, or one process reading whole
tensors to evaluate the checkpoint).

What the folder holds: DCP's `.metadata` and one `__<rank>_0.distcp` per rank, with `model` (what
trains: a LoRA run's frozen base is left out, as in a file checkpoint), `optimizer` (Adam's state
keyed by parameter name) and, mid-version, `prox`; `trainer.pt` holds everything else a file
checkpoint holds (version, counters, ledger, history, the row plan, the frozen base's record).
"""
from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path

SUFFIX = ".dcp"
SHARDED = ("model", "optimizer", "prox")   # the parts every rank writes its shards of
TRAINER_FILE = "trainer.pt"


class TornFolder(OSError):
    """A sharded checkpoint whose files do not read back whole (a shard cut short or gone).
    An OSError, as a torn checkpoint file's error is, so the resume passes over it for the
    checkpoint before it."""


@contextlib.contextmanager
def _read_errors(folder: Path):
    """DCP reports a failed read as CheckpointException, a BaseException (every rank raises it
    together: DCP gathers the ranks' errors), which no `except Exception` meets: it becomes a
    TornFolder naming the folder and the first rank's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        rank, (err, _stack) = next(iter(e.failures.items()))   # rank -> (its exception, its stack)
        line = (str(err).strip().splitlines() or [""])[0][:200]
        raise TornFolder(f"{folder}: its shards do not read (rank {rank}: {type(err).__name__}: {line})") from None


def save(state: dict, folder: Path, group, leader: bool) -> None:
    """Write this rank's shards of `state` into `folder` (collective over `group`: every Trainer
    rank calls it with the same keys); the leader also writes the rest of `state`. When it returns
    on the leader, every rank's files are on disk (DCP's leader writes `.metadata` only after the
    others report their writes done), each one fsynced."""
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save({k: state[k] for k in SHARDED if k in state}, storage_writer=dcp.FileSystemWriter(folder),
             process_group=group)
    if leader:
        path = folder / TRAINER_FILE
        torch.save({k: v for k, v in state.items() if k not in SHARDED}, path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def saved_parts(folder: Path) -> set[str]:
    """Which of `SHARDED` a folder holds (from its metadata: no tensor is read)."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(folder).read_metadata()
    return {path[0] for path in (meta.planner_data or {}).values()}


def load_into(folder: Path, parts: dict, group) -> None:
    """Fill `parts` ({"model": this rank's state dict, ...}: DTensors as the model holds them) in
    place from `folder`, each rank reading the pieces of its own shards (collective over `group`).
    A tensor `parts` names that the folder lacks is an error naming it."""
    import torch.distributed.checkpoint as dcp

    with _read_errors(folder):
        dcp.load(parts, checkpoint_id=folder, process_group=group)


def read_whole(folder: Path, parts: tuple[str, ...] = ("model", "prox")) -> dict:
    """The folder's `parts` as one process reads them, no process group: whole tensors on the CPU
    (an evaluation, policy.init_from)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(folder).read_metadata()
    nested: dict[str, dict] = {}
    for key, path in (meta.planner_data or {}).items():
        item = meta.state_dict_metadata[key]
        if path[0] in parts and len(path) == 2 and isinstance(item, TensorStorageMetadata):
            nested.setdefault(path[0], {})[path[1]] = torch.empty(item.size, dtype=item.properties.dtype)
    with warnings.catch_warnings():   # DCP's note that no process group means one process: the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        with _read_errors(folder):
            dcp.load(nested, checkpoint_id=folder, no_dist=True)
    return nested
