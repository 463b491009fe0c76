"""Checkpoint files of a run: their names, their order, and how one is published.

A Trainer writes `ckpt/v000012.pt` at the end of version 12 and, on a preemption signal,
`ckpt/v000012-s0005.pt` after optimizer step 5 of version 12. The learner decides the file's
format (torch.save for torch policies, npz for the emulated one); this module only names, orders
and publishes: a checkpoint is written under a temporary name and renamed into place, so a
reader never sees half a file.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import zipfile
from pathlib import Path

from . import faults


def ckpt_order(path: Path) -> tuple[int, int]:
    """v000012.pt -> (12, 0); v000012-s0005.pt -> (12, 5): later checkpoints sort last."""
    m = re.fullmatch(r"v(\d+)(?:-s(\d+))?\.pt", path.name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (-1, -1)


def ckpt_name(version: int, step_in_version: int = 0) -> str:
    """The file name of the checkpoint after `step_in_version` optimizer steps of `version`."""
    return f"v{version:06d}" + (f"-s{step_in_version:04d}" if step_in_version else "") + ".pt"


def all_ckpts(ckpt_dir: Path) -> list[Path]:
    """Every checkpoint of a run, oldest first."""
    return sorted(ckpt_dir.glob("v*.pt"), key=ckpt_order)


class CheckpointError(RuntimeError):
    """A file given as a checkpoint is not one that loads (safely)."""


def load_torch(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """A torch checkpoint, loaded with weights_only=True. A file that does not load (truncated by
    a crash or a full disk, or not a checkpoint at all) is named; torch's own advice to load it
    unsafely is left out, and so is its traceback."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, zipfile.BadZipFile) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        why = f"{type(e).__name__}" + (f": {first[:200]}" if first and "weights_only" not in first else "")
        raise CheckpointError(f"{path}: not a readable checkpoint ({why}). A run's ckpt/v*.pt or the output of "
                              "python -m rlvla3.sft is one; a file cut short (a crash while writing, a full disk) "
                              "is not") from None


def publish(save, state: dict, path: Path) -> Path:
    """save(state, tmp), fsync it, rename tmp -> path (atomic within the folder), fsync the folder:
    after a crash the name holds the whole new checkpoint or the folder holds the old ones."""
    tmp = path.with_suffix(".tmp")
    try:
        save(state, tmp)
    except (OSError, RuntimeError) as e:
        tmp.unlink(missing_ok=True)   # the previous checkpoints are untouched
        raise CheckpointError(f"writing checkpoint {path} failed: {why_write_failed(e, path.parent)}; "
                              f"the checkpoints before it in {path.parent} are intact") from e
    faults.reach("ckpt_save")
    _fsync(tmp)
    tmp.rename(path)
    _fsync(path.parent)
    return path


def why_write_failed(e: BaseException, folder: Path) -> str:
    """A write error in words. A full disk is said as such: torch reports it as
    `[enforce fail at inline_container.cc] unexpected pos`, which names neither cause nor place."""
    full = getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if full or (free is not None and free < 1 << 20):
        return f"no space left on {folder} ({free if free is not None else '?'} bytes free)"
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_newest(load, ckpt_dir: Path, say=print) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, as (path, state); one that does not is named and passed
    over for the one before it (a node crash can leave a named but truncated file). None: no
    checkpoint, or none loads."""
    for path in reversed(all_ckpts(ckpt_dir)):
        try:
            return path, load(path)
        except (CheckpointError, OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            say(f"checkpoint {path} does not load ({str(e).splitlines()[0][:300]}); trying the one before it")
    return None
