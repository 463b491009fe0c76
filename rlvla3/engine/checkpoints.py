"""Checkpoint files of a run: their names, their order, how one is published, written off the
Trainer's loop, and how many are kept.

A Trainer writes `ckpt/v000012.pt` at the end of version 12 and, on a preemption signal,
`ckpt/v000012-s0005.pt` after optimizer step 5 of version 12; a model sharded over Trainer ranks
(policy.data_parallel=fsdp) writes folders instead, `ckpt/v000012.dcp/`, each rank its own shards
(sharded_checkpoints.py). The learner decides the format (torch.save for torch policies, npz for
the emulated one, DCP for sharded ones); this module only names, orders and publishes: a
checkpoint is written under a temporary name and renamed into place, so a reader never sees half
of one. A version's checkpoint is written by `Saver` on a thread of its
own from a snapshot of the state (the Trainer waits for the copy, not for the disk); what must
follow the file (deleting the shards it commits, an evaluation of it) runs once it is published.
`runtime.keep_ckpts` bounds the disk: older checkpoints go once a newer one is published.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from . import faults, sharded_checkpoints


def ckpt_order(path: Path) -> tuple[int, int]:
    """v000012.pt -> (12, 0); v000012-s0005.pt (or .dcp) -> (12, 5): later checkpoints sort last."""
    m = re.fullmatch(r"v(\d+)(?:-s(\d+))?\.(?:pt|dcp)", path.name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else (-1, -1)


def ckpt_name(version: int, step_in_version: int = 0, sharded: bool = False) -> str:
    """The name of the checkpoint after `step_in_version` optimizer steps of `version` (a file;
    `sharded`: a folder of per-rank shards)."""
    return f"v{version:06d}" + (f"-s{step_in_version:04d}" if step_in_version else "") + (sharded_checkpoints.SUFFIX if sharded else ".pt")


def all_ckpts(ckpt_dir: Path) -> list[Path]:
    """Every checkpoint of a run, oldest first."""
    return sorted((p for p in ckpt_dir.glob("v*") if ckpt_order(p)[0] >= 0), key=ckpt_order)


def is_sharded(path: Path) -> bool:
    return Path(path).suffix == sharded_checkpoints.SUFFIX


def remove(path: Path) -> None:
    """Delete a checkpoint, file or folder."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def read(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """A checkpoint of either kind with whole tensors, as one process reads it (an evaluation,
    policy.init_from): a file as `load_torch` reads it; a sharded folder's model (and π_prox),
    without its optimizer state."""
    if is_sharded(Path(path)):
        try:
            return {**load_torch(Path(path) / sharded_checkpoints.TRAINER_FILE),
                    **sharded_checkpoints.read_whole(Path(path))}
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path}: not a readable checkpoint folder ({type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})") from None
    return load_torch(path, map_location=map_location, mmap=mmap)


def exists(path: str | Path) -> bool:
    """A checkpoint file, or a sharded checkpoint's folder."""
    p = Path(path)
    return p.is_file() or (is_sharded(p) and p.is_dir())


def link_copy(src: Path, dst: Path) -> None:
    """`dst` holds `src`'s bytes without copying them where the filesystem allows (hard links,
    one per file of a folder), else as a copy; an old `dst` is replaced."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    remove(tmp)
    if src.is_dir():
        try:
            shutil.copytree(src, tmp, copy_function=os.link)
        except OSError:   # a filesystem without hard links
            remove(tmp)
            shutil.copytree(src, tmp)
        remove(dst)   # a folder is not replaced by a rename: the old one goes first
    else:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


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


def publish(save, state: dict, path: Path, rename: bool = True) -> Path:
    """save(state, tmp), fsync it, rename tmp -> path (atomic within the folder), fsync the folder:
    after a crash the name holds the whole new checkpoint or the folder holds the old ones.
    rename=False: write this rank's part of a sharded checkpoint into tmp; the leader renames."""
    tmp = path.with_suffix(".tmp")
    try:
        save(state, tmp)
    except (OSError, RuntimeError) as e:
        if rename:
            remove(tmp)   # the previous checkpoints are untouched
        raise CheckpointError(f"writing checkpoint {path} failed: {why_write_failed(e, path.parent)}; "
                              f"the checkpoints before it in {path.parent} are intact") from e
    if not rename:
        return tmp
    faults.reach("ckpt_save")
    _fsync(tmp)
    if tmp.is_dir():
        remove(path)   # written again after a resume (a folder is not replaced by a rename)
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


def prune(ckpt_dir: Path, keep: int, in_use: set[str] = frozenset()) -> list[Path]:
    """runtime.keep_ckpts: delete all but the newest `keep` checkpoints (a preemption checkpoint
    counts as one; 0 keeps every one). Never best.pt (a hard link: its bytes stay while it names
    them) nor a file an evaluation still reads (`in_use`, by name). Returns what was deleted."""
    if keep <= 0:
        return []
    old = [p for p in all_ckpts(ckpt_dir)[:-keep] if p.name not in in_use]
    for p in old:
        remove(p)
    return old


def snapshot(state, into=None):
    """A copy of `state` that training cannot change while it is written: every tensor copied to
    host memory (on a GPU this is the device-to-host staging copy), every array copied; the rest
    (counters, JSON strings) is immutable or rebuilt per checkpoint. `into`: the previous
    checkpoint's snapshot, written already; a tensor of the same shape and dtype there is copied
    into (no new allocation: fresh pages cost more than the copy)."""
    if isinstance(state, dict):
        old = into if isinstance(into, dict) else {}
        return {k: snapshot(v, old.get(k)) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        old = into if isinstance(into, (list, tuple)) and len(into) == len(state) else [None] * len(state)
        return type(state)(snapshot(v, o) for v, o in zip(state, old))
    if hasattr(state, "detach"):   # a torch tensor (torch is never imported on emulated ranks)
        if hasattr(into, "copy_") and into.shape == state.shape and into.dtype == state.dtype:
            return into.copy_(state.detach())
        return state.detach().to("cpu", copy=True)
    if hasattr(state, "copy") and hasattr(state, "dtype"):   # a numpy array
        if isinstance(into, type(state)) and into.shape == state.shape and into.dtype == state.dtype:
            into[...] = state
            return into
        return state.copy()
    return state


class Saver:
    """Publishes checkpoints on a thread of its own, one at a time.

    `submit` returns as soon as the write has started; `poll` (from the Trainer's loop) finishes
    each published checkpoint on the Trainer's thread: it raises a write's error, prunes old
    checkpoints and runs the checkpoint's `then(path)` (pruning here, not on the writer thread,
    reads `in_use` where the evaluations it names change); `wait` blocks until the write in
    flight is published (a preemption checkpoint, the job's end, or a second checkpoint due
    before the first is on disk), at most `timeout` s.

    publishes=False: a Trainer rank that writes its part of a sharded checkpoint, which the
    leader's Saver publishes (renames, prunes, follows up)."""

    def __init__(self, save: Callable[[dict, Path], None], ckpt_dir: Path, keep: int, timeout: float,
                 in_use: Callable[[], set[str]] = frozenset, publishes: bool = True):
        self.save, self.ckpt_dir, self.keep, self.timeout, self.in_use = save, ckpt_dir, keep, timeout, in_use
        self.publishes = publishes
        self.thread: threading.Thread | None = None
        self.staging = None   # the last snapshot, its memory reused by the next one once written
        self.pending: tuple[Path, Callable[[Path], None] | None] | None = None
        self.error: BaseException | None = None
        self.stall_s = 0.0    # what submits and waits cost the Trainer's loop, in all

    def submit(self, state: dict, path: Path, then: Callable[[Path], None] | None = None) -> None:
        self.wait()
        t0 = time.monotonic()
        state = self.staging = snapshot(state, self.staging)
        self.pending = (path, then)
        self.thread = threading.Thread(target=self._write, args=(state, path), name=f"ckpt {path.name}", daemon=True)
        self.thread.start()
        self.stall_s += time.monotonic() - t0

    def write_now(self, state: dict, path: Path) -> Path:
        """Publish `state` before returning (a preemption checkpoint: rank 0 requeues on its ack)."""
        self.wait()
        publish(self.save, state, path, self.publishes)
        if self.publishes:
            prune(self.ckpt_dir, self.keep, self.in_use())
        return path

    def _write(self, state: dict, path: Path) -> None:
        try:
            publish(self.save, state, path, self.publishes)
        except BaseException as e:   # raised again on the Trainer's thread by poll/wait
            self.error = e

    def poll(self) -> bool:
        """Finish a write that has ended: raise its error, or run its follow-up. True if one ended."""
        if self.thread is None or self.thread.is_alive():
            return False
        self._finish()
        return True

    def wait(self) -> None:
        if self.thread is None:
            return
        t0 = time.monotonic()
        self.thread.join(self.timeout)
        if self.thread.is_alive():
            raise CheckpointError(f"writing checkpoint {self.pending[0]} took more than runtime.ckpt_write_timeout="
                                  f"{self.timeout:g} s; is {self.ckpt_dir} on a filesystem that answers? Raise the "
                                  "limit for a slow one")
        self.stall_s += time.monotonic() - t0
        self._finish()

    def _finish(self) -> None:
        (path, then), self.pending, self.thread = self.pending, None, None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if not self.publishes:
            return
        prune(self.ckpt_dir, self.keep, self.in_use())
        if then is not None:
            then(path)
