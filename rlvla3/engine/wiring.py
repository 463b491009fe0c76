"""The wiring: every message edge of the engine, and the check that holds the code to it.

An edge names its source role, destination role, tag and message type. `Transport` (transport.py)
sends and receives only through `Wiring.check_send` / `check_recv`, so a message on an edge that
is not listed here is refused where it is sent (or received), naming both ranks. The list is
also what heartbeats follow: a rank beats to, and expects beats from, both ends of every edge it
is on (`peers`); a peer silent past `runtime.liveness_timeout` aborts the job naming that rank.

Roles: simulator, generator, trainer (any Trainer), two that name one rank: trainer0 (the
leading Trainer) and rank0 (global rank 0, which requeues a preempted Slurm job and answers the
clock sync), and relay: a Generator as a node of the weights' relay tree, whose counterparts are
its parent and children there (`World.weights_tree`). A colocated rank plays generator and
trainer at once; its Trainer reaches its own Generator over the same edges, delivered
in-process by the transport.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .protocol import CheckpointAck, ClockSync, Done, GroupAddress, Heartbeat, ShardReady, Stop, Tag, TrainOrder, WeightsHeader, tag_family

BUFFER = np.ndarray   # bulk data: a preallocated numpy buffer sent with the uppercase MPI calls


def tag_name(tag: int) -> str:
    return Tag(tag).name if tag in Tag._value2member_map_ else str(tag)


class WiringError(RuntimeError):
    """A message on an edge the wiring does not list (a bug in the engine, never a user's)."""


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    tag: int       # a Tag (OBS and ACTION stand for their per-group ranges)
    message: type
    what: str


EDGES = (
    Edge("simulator", "generator", Tag.OBS, BUFFER, "a group's observations (protocol.obs_codec), tag OBS + gid"),
    Edge("generator", "simulator", Tag.ACTION, BUFFER, "the action reply (protocol.action_codec), tag ACTION + gid"),
    Edge("simulator", "trainer", Tag.SHARD_READY, ShardReady, "a shard was published (to every Trainer)"),
    Edge("trainer0", "generator", Tag.WEIGHTS, WeightsHeader, "a version's header, with credits"),
    Edge("trainer0", "generator", Tag.WEIGHTS_BUF, BUFFER, "the version's flat parameters, in buckets (weights.py)"),
    Edge("trainer0", "trainer", Tag.TRAIN_ORDER, TrainOrder, "the next optimizer step, a checkpoint to write shards of, or stop"),
    Edge("trainer0", "trainer", Tag.GROUP_ADDRESS, GroupAddress, "the data-parallel process group's address"),
    Edge("trainer0", "simulator", Tag.STOP, Stop, "stop: the run is over"),
    Edge("trainer0", "generator", Tag.STOP, Stop, "stop: the run is over"),
    Edge("relay", "relay", Tag.WEIGHTS, WeightsHeader, "a version's header, forwarded down the relay tree"),
    Edge("relay", "relay", Tag.WEIGHTS_BUF, BUFFER, "its buckets, each forwarded as it lands"),
    Edge("relay", "relay", Tag.STOP, Stop, "stop, forwarded after any publish in flight"),
    Edge("simulator", "generator", Tag.DONE, Done, "this Simulator has stopped"),
    Edge("simulator", "trainer", Tag.DONE, Done, "this Simulator has stopped"),
    Edge("generator", "trainer0", Tag.DONE, Done, "this Generator has stopped"),
    Edge("trainer0", "rank0", Tag.CKPT_ACK, CheckpointAck, "preemption: checkpoint written, rank 0 may requeue"),
    Edge("any", "rank0", Tag.CLOCK, ClockSync, "clock-offset ping"),
    Edge("rank0", "any", Tag.CLOCK, ClockSync, "clock-offset pong"),
    Edge("peer", "peer", Tag.HEARTBEAT, Heartbeat, "liveness, both ways along every edge above"),
)

# Edges heartbeats do not follow: the clock sync ends before liveness is watched.
UNWATCHED = (Tag.CLOCK, Tag.HEARTBEAT)


def rank_roles(world, rank: int) -> frozenset[str]:
    """Every role name `rank` answers to, the one-rank roles included."""
    roles = set(world.roles_of(rank)) | {"any"}
    if rank == world.train_ranks[0]:
        roles.add("trainer0")
    if rank == 0:
        roles.add("rank0")
    if rank in world.gen_ranks:
        roles.add("relay")
    return frozenset(roles)


def counterparts(world, role: str, rank: int) -> set[int]:
    """Ranks playing `role` that `rank` talks with (groups pin Simulators to their Generators)."""
    if role == "trainer0":
        return {world.train_ranks[0]}
    if role == "rank0":
        return {0}
    if role == "relay":   # its neighbours in the relay tree that are Generators
        if rank not in world.gen_ranks:
            return set()
        parent = world.relay_parent(rank)
        return set(world.relay_children(rank)) | ({parent} if parent in world.gen_ranks else set())
    if role == "trainer":
        return set(world.train_ranks)
    mine = set(world.roles_of(rank))
    if role == "generator" and "simulator" in mine:
        return {world.gen_rank_of(g) for g in world.groups_of_sim(rank)}
    if role == "simulator" and "generator" in mine:
        return {g.sim_rank for g in world.groups_of_gen(world.gen_ranks.index(rank))}
    return set({"simulator": world.sim_ranks, "generator": world.gen_ranks}[role])


def peers(world, rank: int, edges=EDGES) -> tuple[int, ...]:
    """Ranks this rank exchanges heartbeats with: both ends of every watched edge it is on."""
    mine = rank_roles(world, rank)
    out: set[int] = set()
    for e in edges:
        if e.tag in UNWATCHED:
            continue
        if e.src in mine:
            out |= counterparts(world, e.dst, rank)
        if e.dst in mine:
            out |= counterparts(world, e.src, rank)
    out.discard(rank)
    return tuple(sorted(out))


class Wiring:
    """The edges as this rank may use them. Checks are cached per (peer, tag), so the hot path
    (an action request or reply) costs one dict lookup."""

    def __init__(self, edges, roles: dict[int, frozenset[str]], rank: int, peers: tuple[int, ...]):
        self.edges, self.roles, self.rank, self.peers = tuple(edges), roles, rank, set(peers)
        self.by_tag: dict[int, list[Edge]] = {}
        for e in self.edges:
            self.by_tag.setdefault(int(e.tag), []).append(e)
        self._ok: dict[tuple[int, int, int], Edge] = {}
        self.used: set[Edge] = set()   # edges this rank sent on (tests: every listed edge is used)
        self._send_ok: dict[tuple[int, int], Edge] = {}

    @classmethod
    def of(cls, world, rank: int) -> "Wiring":
        return cls(EDGES, {r: rank_roles(world, r) for r in range(world.size)}, rank, peers(world, rank))

    def name(self, rank: int) -> str:
        roles = sorted(r for r in self.roles.get(rank, ()) if r not in ("any", "trainer0", "rank0"))
        return f"rank {rank} ({'+'.join(roles) or '?'})"

    def _edge(self, src: int, dst: int, tag: int) -> Edge:
        key = (src, dst, tag)
        edge = self._ok.get(key)
        if edge is not None:
            return edge
        family = tag_family(tag)
        for e in self.by_tag.get(family, ()):
            if e.src == "peer":
                ok = (dst if src == self.rank else src) in self.peers
            else:
                ok = e.src in self.roles.get(src, ()) and e.dst in self.roles.get(dst, ())
            if ok:
                self._ok[key] = e
                return e
        raise WiringError(f"no edge {self.name(src)} -> {self.name(dst)} with tag {tag_name(family)} "
                          f"(raw tag {tag}) in the edge list")

    def check_send(self, dst: int, tag: int, msg) -> None:
        edge = self._send_ok.get((dst, tag))
        if edge is None:
            edge = self._send_ok[(dst, tag)] = self._edge(self.rank, dst, tag)
            self.used.add(edge)
        if not isinstance(msg, edge.message):
            raise WiringError(f"{self.name(self.rank)} -> {self.name(dst)} {tag_name(edge.tag)}: expected "
                              f"{edge.message.__name__}, got {type(msg).__name__}")

    def check_recv(self, src: int, tag: int) -> None:
        self._edge(src, self.rank, tag)
