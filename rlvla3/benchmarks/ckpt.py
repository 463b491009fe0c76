"""`python -m rlvla3.bench ckpt [--params 1e6,1e7,1e8] [--repeats 3] [--versions 50]`

Two questions about checkpoints, each answered by the engine's own code:

1. How long the Trainer's loop waits per checkpoint: a model of `--params` float32 parameters
   with AdamW's state after one step (what the torch learner saves: model and optimizer), in
   both formats (`file`: one torch.save file; `dcp`: the parameters sharded by FSDP, here over
   one rank, written as a sharded folder through torch.distributed.checkpoint, as
   policy.data_parallel=fsdp writes them), written
   synchronously (`checkpoints.publish`, what the Trainer did before) and through `Saver` (the
   state copied on the loop into the staging memory of the Saver's previous checkpoint, written
   on a thread while the loop goes on taking optimizer steps on the live model; one Saver, its
   first checkpoint a warm-up), taking turns in one folder. Per row: the median seconds of a synchronous
   save, of the loop's wait with the Saver, their ratio, and the Saver's whole write; each
   Saver file is loaded back and compared with the weights at the moment it was submitted (the
   steps taken meanwhile must not reach it).
2. How much disk a run's checkpoints take: a real local job of the emulated workload for
   `--versions` versions with runtime.keep_ckpts=3, its ckpt/ folder sampled every 10 ms; the
   most files it ever held (kept checkpoints, the one being written, best.pt) against keep + 2.
"""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from ..cluster.compose import compose
from ..cluster.local import run_local
from ..engine import checkpoints, fsdp, sharded_checkpoints
from .common import save_rows
from .throughput import WORKLOADS

KEEP = 3


FORMATS = ("file", "dcp")


def trained_state(n_params: int, fmt: str):
    """(parameters, optimizer, state, save): `n_params` float32 parameters in chunks of at most
    2^24, AdamW after one step (its two moments per parameter), the dict the torch learner saves
    in format `fmt`, and the function that writes it."""
    import torch

    sizes = [min(1 << 24, n_params - i) for i in range(0, n_params, 1 << 24)]
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for n in sizes])
    if fmt == "dcp":
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        fsdp.one_rank_group(torch.device("cpu"))
        fully_shard(model)
        group = dist.new_group(backend="gloo")
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    train_step(params, opt)
    if fmt == "file":
        return params, opt, {"model": {f"p{i}": p for i, p in enumerate(params)}, "optimizer": opt.state_dict(),
                             "version": 1, "opt_step": 1}, torch.save
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, opt), "version": 1, "opt_step": 1}
    return params, opt, state, lambda st, path: sharded_checkpoints.save(st, path, group, leader=True)


def first_saved(path: Path):
    """The first parameter as the checkpoint at `path` holds it (either format)."""
    model = checkpoints.read(path)["model"]
    return model["p0"] if "p0" in model else model["0"]


def train_step(params, opt) -> None:
    """One optimizer step that changes every parameter in place (what training does meanwhile)."""
    import torch

    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()


def time_sync(save, state: dict, path: Path) -> float:
    t0 = time.perf_counter()
    checkpoints.publish(save, state, path)
    return time.perf_counter() - t0


def time_saver(saver, params, opt, state: dict, path: Path) -> tuple[float, float, int]:
    """(the loop's wait, the whole write, optimizer steps taken during it); checks the file holds
    the submitted weights, not the ones trained since."""
    import torch

    submitted = fsdp.full(params[0].detach()).clone()
    t0 = time.perf_counter()
    saver.submit(state, path)
    stall = time.perf_counter() - t0
    steps = 0
    while not saver.poll():
        train_step(params, opt)
        steps += 1
    write = time.perf_counter() - t0
    if not torch.equal(first_saved(path), submitted):
        raise SystemExit(f"{path}: the Saver wrote weights trained after the submit ({steps} steps later)")
    return stall, write, steps


def stall_rows(counts: list[int], repeats: int, folder: Path) -> list[dict]:
    rows = []
    for n in counts:
        for fmt in FORMATS:
            params, opt, state, save = trained_state(n, fmt)
            suffix = sharded_checkpoints.SUFFIX if fmt == "dcp" else ".pt"
            # One Saver for the run, as a Trainer has: its first snapshot allocates the staging
            # memory (not timed: a warm-up), later ones copy into it.
            saver = checkpoints.Saver(save, folder, keep=0, timeout=3600)
            time_saver(saver, params, opt, state, folder / f"warmup{suffix}")
            sync, stall, write, steps = [], [], [], []
            for r in range(repeats):
                sync.append(time_sync(save, state, folder / f"sync{r}{suffix}"))
                s, w, k = time_saver(saver, params, opt, state, folder / f"saver{r}{suffix}")
                stall.append(s)
                write.append(w)
                steps.append(k)
                for p in folder.glob(f"*{suffix}"):
                    checkpoints.remove(p)
            med = lambda xs: sorted(xs)[len(xs) // 2]   # noqa: E731
            gb = sum(p.numel() for p in params) * 4 * 3 / 1e9   # weights and AdamW's two moments
            rows.append({"params": n, "format": fmt, "state_gb": gb, "sync_save_s": med(sync), "saver_wait_s": med(stall),
                         "wait_over_sync": med(stall) / med(sync), "saver_write_s": med(write),
                         "steps_during_write": med(steps)})
            del params, opt, state, saver
    return rows


def disk_row(versions: int, out: Path, timeout: float) -> dict:
    """The most files ckpt/ ever held during a real `versions`-version run with keep_ckpts=KEEP."""
    cfg = compose([*WORKLOADS["emulated"], f"algo.max_versions={versions}",
                   f"runtime.keep_ckpts={KEEP}", "runtime.progress=false"])
    run = out / "disk"
    most, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                most[0] = max(most[0], sum(1 for _ in (run / "ckpt").iterdir()))
            except FileNotFoundError:
                pass
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    proc = run_local(cfg, run, timeout=timeout, capture=True)
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"the {versions}-version run failed (exit {proc.returncode}); see {run}/logs\n{proc.stdout[-2000:]}")
    left = sorted(p.name for p in (run / "ckpt").iterdir())
    return {"versions": versions, "keep_ckpts": KEEP, "most_files": most[0], "bound": KEEP + 2, "files_at_end": left}


def run(a) -> int:
    counts = [int(float(x)) for x in a.params.split(",")]
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    folder = out / "stall"
    folder.mkdir(parents=True, exist_ok=True)
    rows = stall_rows(counts, a.repeats, folder)
    print(f"{'params':>12} {'format':>6} {'state GB':>9} {'sync save s':>12} {'Saver wait s':>13} {'wait/sync':>10} "
          f"{'Saver write s':>14} {'steps meanwhile':>16}")
    for r in rows:
        print(f"{r['params']:>12.3g} {r['format']:>6} {r['state_gb']:>9.2f} {r['sync_save_s']:>12.3f} {r['saver_wait_s']:>13.3f} "
              f"{r['wait_over_sync']:>10.3f} {r['saver_write_s']:>14.3f} {r['steps_during_write']:>16}")
    disk = disk_row((a.versions or 50), out, a.timeout)
    print(f"\n{disk['versions']} versions, runtime.keep_ckpts={disk['keep_ckpts']}: ckpt/ held at most "
          f"{disk['most_files']} files (bound keep + 2 = {disk['bound']}); at the end: {', '.join(disk['files_at_end'])}")
    save_rows(str(out), "ckpt.json", [*rows, disk])
    return 0 if disk["most_files"] <= disk["bound"] else 1
