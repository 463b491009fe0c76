"""The engine in one process (engine/inprocess.py): the real roles, messages, edges, batcher,
credits, shards and checkpoints over in-process links, checked between passes. Seconds per run,
so the engine's rules are tested directly; tests/engine/test_engine.py keeps the same runs over mpiexec."""
from __future__ import annotations

import ast
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from rlvla3.cluster.compose import compose
from rlvla3.engine import shards
from rlvla3.engine.generator import Generator
from rlvla3.engine.inprocess import InProcessRun
from rlvla3.engine.protocol import Kind, Tag
from rlvla3.engine.run import Preemption
from rlvla3.engine.trainer import Trainer
from rlvla3.engine.wiring import EDGES, Wiring, WiringError
from rlvla3.world import derive
from tests.conftest import EMULATED_FAST, TOY, check_every_shard_consumed_once

FAST_TOY = [*TOY, "algo.update_epochs=2"]
ENGINE = Path(__file__).resolve().parents[2] / "rlvla3" / "engine"


def credit_gate(run: InProcessRun) -> None:
    """Between passes: a Generator batches an ACT request only within its credits, and holds the
    rest (this is what bounds staleness)."""
    for roles in run.roles:
        for g in (r for r in roles if isinstance(r, Generator)):
            for req in g.batcher.queue:
                assert req.kind == Kind.BOOTSTRAP or req.step <= g.granted_until, (req.gid, req.step, g.granted_until)
            for req in g.held:
                assert req.step > g.granted_until


def record_batches(run: InProcessRun) -> dict[int, list[list[int]]]:
    """Per Generator index, the gids of every batch it serves (the real method, observed)."""
    seen: dict[int, list[list[int]]] = defaultdict(list)
    for i, g in enumerate(r for roles in run.roles for r in roles if isinstance(r, Generator)):
        def serve(g=g, i=i, real=g._serve_batch):
            before = {r.gid for r in g.batcher.queue}
            real()
            seen[i].append(sorted(before - {r.gid for r in g.batcher.queue}))
        g._serve_batch = serve
    return seen


def record_orders(run: InProcessRun) -> list:
    trainer = run.role(Trainer)
    orders = []
    real = trainer._execute

    def execute(order):
        orders.append(order)
        real(order)
    trainer._execute = execute
    return orders


def shard_staleness_ok(run_dir: Path, eta: int) -> None:
    for n in shards.scan(run_dir / "shards"):
        step = shards.parse_name(n)[0]
        v = shards.read_shard(run_dir / "shards" / n)[0]["versions"]
        assert v.min() >= step - eta, f"{n}: version {v.min()} is more than eta={eta} behind step {step}"


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_toy_runs_in_process_in_both_modes(tmp_path, mode):
    cfg = compose([*FAST_TOY, f"mode={mode}"])
    run = InProcessRun(cfg, tmp_path)
    orders = record_orders(run)
    t0 = time.monotonic()
    run.run(timeout=240, check=credit_gate)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["versions"] == 3 and time.monotonic() - t0 < 240
    check_every_shard_consumed_once(tmp_path, 3, cfg.algo.rollout_batch)
    shard_staleness_ok(tmp_path, cfg.mode.eta)
    # The plan cursor: every optimizer step trains exactly global_batch rows; each epoch of a
    # version covers every row of the version's shards exactly once.
    world = run.world
    assert len(orders) == 3 * world.opt_steps_per_version
    assert all(sum(s.stop - s.start for s in o.slices) == cfg.algo.global_batch for o in orders)
    for k in range(3):
        mine = [o for o in orders if o.version == k]
        assert [o.end_of_version for o in mine] == [False] * (len(mine) - 1) + [True]
        for e in range(cfg.algo.update_epochs):
            epoch = mine[e * world.opt_steps_per_epoch:(e + 1) * world.opt_steps_per_epoch]
            covered = defaultdict(list)
            for o in epoch:
                for s in o.slices:
                    covered[s.name].append((s.start, s.stop))
            for name, ranges in covered.items():
                rows = sorted(ranges)
                assert rows[0][0] == 0 and all(a[1] == b[0] for a, b in zip(rows, rows[1:])), (name, rows)
            assert sum(b - a for r in covered.values() for a, b in r) == cfg.algo.rollout_batch


def test_sync_generator_serves_lockstep_rounds(tmp_path):
    """mode=sync: a Generator serves rounds, each holding every group it serves exactly once
    (two Simulator ranks on one Generator; B_max splits a round into batches)."""
    cfg = compose([*FAST_TOY, "mode=sync", "cluster.sim_ranks=2", "generator.b_max=8", "algo.max_versions=2"])
    run = InProcessRun(cfg, tmp_path)
    batches = record_batches(run)
    run.run(timeout=240, check=credit_gate)
    gen = run.role(Generator)
    served = sorted(gen.groups)
    flat = [gid for b in batches[0] for gid in b]
    rounds = [flat[i:i + len(served)] for i in range(0, len(flat), len(served))]
    assert len(rounds) > 10
    for r, groups in enumerate(rounds[:-1]):
        assert sorted(groups) == served, f"round {r}: {groups}"
    assert len(set(rounds[-1])) == len(rounds[-1])   # the last round may be cut short by the stop
    assert max(sum(gen.groups[gid].size for gid in b) for b in batches[0]) == run.world.b_max == 8


def test_credit_gate_holds_requests_of_a_step_beyond_eta(tmp_path):
    """eta=0 with a slow Trainer: Simulators run into the next rollout step, the Generator holds
    their requests until the version is published, and no sample is staler than eta."""
    cfg = compose([*EMULATED_FAST, "mode.eta=0", "policy.train_samples_per_s=200"])
    run = InProcessRun(cfg, tmp_path)
    held = []
    run.run(timeout=120, check=lambda r: (credit_gate(r), held.append(len(r.role(Generator).held))))
    assert max(held) > 0, "no request was ever held: the test does not exercise the gate"
    shard_staleness_ok(tmp_path, 0)


def test_emulated_data_parallel_trainers_and_colocated_placement(tmp_path):
    run = InProcessRun(compose([*EMULATED_FAST, "cluster.train_ranks=2"]), tmp_path / "dp")
    run.run(timeout=120, check=credit_gate)
    digests = {p.read_text() for p in (tmp_path / "dp").glob("params-trainer*.sha256")}
    assert len(digests) == 1 and len(list((tmp_path / "dp").glob("params-trainer*.sha256"))) == 2
    # Colocated: Trainer and Generator share a rank; the weights reach the Generator over the
    # same WEIGHTS edge, delivered in-process.
    colo = InProcessRun(compose([*EMULATED_FAST, "mode=sync", "mode.placement=colocated", "cluster.gen_ranks=2",
                                 "cluster.train_ranks=2"]), tmp_path / "colo")
    colo.run(timeout=120, check=credit_gate)
    assert json.loads((tmp_path / "colo" / "summary.json").read_text())["versions"] == 3
    rank = colo.world.train_ranks[0]
    assert any(e.tag == Tag.WEIGHTS for e in colo.transports[rank].wiring.used)


def test_preemption_checkpoints_mid_version_and_acknowledges(tmp_path):
    requeued = []
    pre = Preemption(requeue=lambda: requeued.append(time.monotonic()), timeout=60)
    cfg = compose([*EMULATED_FAST, "algo.max_versions=6"])
    run = InProcessRun(cfg, tmp_path, preemption=pre)

    def signal_after_first_steps(r):
        if r.role(Trainer).opt_step >= 3 and not pre.requested:
            pre.handler(None, None)
    run.run(timeout=120, check=signal_after_first_steps, until=lambda r: bool(requeued))
    ckpts = sorted(p.name for p in (tmp_path / "ckpt").glob("v*.pt"))
    assert requeued and any("-s" in n for n in ckpts), ckpts
    assert any(e.tag == Tag.CKPT_ACK for e in run.transports[run.world.train_ranks[0]].wiring.used)


def test_every_listed_edge_is_used_and_every_tag_is_listed(tmp_path):
    # Static: every Tag the engine's code names is on some edge, and every edge's tag is named.
    named = set()
    for path in ENGINE.glob("*.py"):
        if path.name in ("protocol.py", "wiring.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Tag":
                named.add(Tag[node.attr])
    assert named == {Tag(e.tag) for e in EDGES}, named ^ {Tag(e.tag) for e in EDGES}
    # Dynamic: async disaggregated with two Trainers, sync colocated, preemption: every edge is
    # sent on, except the two that need separate processes (the clock sync of run.main and the
    # torch process group's address), which the mpiexec tests send.
    used = set()
    for name, overrides in (("a", [*EMULATED_FAST, "cluster.train_ranks=2", "cluster.gen_ranks=2",
                                   "generator.weights_fanout=1"]),
                            ("c", [*EMULATED_FAST, "mode=sync", "mode.placement=colocated"])):
        run = InProcessRun(compose(overrides), tmp_path / name)
        run.run(timeout=120)
        used |= {e for t in run.transports for e in t.wiring.used}
    requeued = []
    pre = Preemption(requeue=lambda: requeued.append(1))
    run = InProcessRun(compose(EMULATED_FAST), tmp_path / "p", preemption=pre)
    run.run(timeout=120, check=lambda r: pre.handler(None, None) if r.role(Trainer).opt_step >= 1 else None,
            until=lambda r: bool(requeued))
    used |= {e for t in run.transports for e in t.wiring.used}
    missing = {(e.src, e.dst, Tag(e.tag).name) for e in EDGES if e not in used}
    assert missing == {("any", "rank0", "CLOCK"), ("rank0", "any", "CLOCK"), ("trainer0", "trainer", "GROUP_ADDRESS")}


def test_a_message_off_the_edge_list_is_refused():
    world = derive(compose(["+experiment=emulated", "cluster.train_ranks=2"]))
    sim = Wiring.of(world, world.sim_ranks[0])
    trainer = world.train_ranks[1]
    from rlvla3.engine.protocol import Stop, WeightsHeader

    with pytest.raises(WiringError, match=r"no edge rank 0 \(simulator\) -> rank 3 \(trainer\) with tag STOP"):
        sim.check_send(trainer, Tag.STOP, Stop("no"))
    lead = Wiring.of(world, world.train_ranks[0])
    with pytest.raises(WiringError, match="expected WeightsHeader, got Stop"):
        lead.check_send(world.gen_ranks[0], Tag.WEIGHTS, Stop("wrong type"))
    lead.check_send(world.gen_ranks[0], Tag.WEIGHTS, WeightsHeader(0, 1, 10))   # listed: accepted
    gen = Wiring.of(world, world.gen_ranks[0])
    with pytest.raises(WiringError, match="ACTION"):
        gen.check_send(world.train_ranks[0], Tag.ACTION + 3, np.zeros(8, np.uint8))
