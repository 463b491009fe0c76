"""What a run derives from its config; the checks that run before any rank starts are in
checks.py (and beside each field in config.py), called from here.

`derive(cfg)` validates a `config.RunConfig` (raising `ConfigError` that names the bad field and
how to fix it) and returns the `World`: which rank plays which role, the env groups of the
sharding plan and the Generator serving each, and the rollout-step arithmetic. `spec(cfg)` is the
observation/sample spec every role agrees on (from the env adapter's dimensions and the policy
family's sample layout). Nothing here imports a simulator, torch or mpi4py: the launcher runs it
on a login node.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import checks
from .algo import ALGORITHMS
from .checks import gpu_ranks  # noqa: F401  (the GPU component's size: the launcher and the planner read it here)
from .config import ConfigError, RunConfig
from .envs import env_dims, in_process
from .policies import SampleLayout, execute_steps, sample_layout

ROLES = ("simulator", "generator", "trainer")


@dataclass(frozen=True)
class Group:
    """One env group: `size` envs on Simulator rank `sim_rank`, served by Generator `gen_index`."""

    gid: int
    sim_rank: int
    size: int
    env_offset: int
    gen_index: int


@dataclass(frozen=True)
class Spec:
    """Shapes of one observation, action chunk and policy sample: what every role agrees on (the
    Simulator's buffers, the wire codecs, the shard arrays, the policy's input)."""

    cameras: int
    image_size: int
    proprio_dim: int
    action_dim: int
    instruction_len: int
    vocab: int
    sample: SampleLayout     # what the policy samples per observation

    @property
    def chunk(self) -> int:
        return self.sample.chunk


def spec(cfg: RunConfig) -> Spec:
    """The Spec of a run: the env adapter's sizes and the policy family's sample layout."""
    e, p = cfg.env, cfg.policy
    dims = env_dims(cfg)
    return Spec(dims.cameras, e.image_size, dims.proprio_dim, dims.action_dim, p.instruction_len, p.vocab,
                sample_layout(p, dims.action_dim))


@dataclass(frozen=True)
class World:
    """What a run derives from its config, computed once by `derive`: the MPI world (which rank
    plays which role), the env groups, and the rollout-step arithmetic. Role code reads these
    fields; it never recomputes them from the config."""

    size: int
    """Ranks in the MPI world (colocated placement: Generator and Trainer share a rank)."""
    sim_ranks: tuple[int, ...]
    gen_ranks: tuple[int, ...]
    train_ranks: tuple[int, ...]
    groups: tuple[Group, ...]
    segments_per_step: int
    """Segments each group contributes to one rollout step."""
    opt_steps_per_epoch: int
    """Optimizer steps in one pass over a rollout step (rollout_batch / global_batch)."""
    opt_steps_per_version: int
    """Optimizer steps per version (update_epochs passes)."""
    b_max: int
    """The batcher's sample limit: generator.b_max capped at policy.max_batch."""
    execute_steps: int
    """Env steps each action chunk executes (policies.execute_steps: the config's, the released
    folder's, or the whole chunk)."""
    episodic: bool
    """Whole episodes per segment (grpo, raft, evaluation): every env of a group resets at each segment
    start, and an env whose episode ended waits for that reset."""
    shared_reset: bool
    """grpo training: a group's envs reset from one seed (`group_seed`), so a GRPO group is one
    initial state. Never in evaluation: there each env resets from its own seeds, so N episodes
    are N distinct initial states, as the Wilson interval assumes."""
    in_process_envs: bool
    """Envs run inside the Simulator rank (toy, emulated, env.in_process), not one child each."""
    colocated: bool
    """mode.placement=colocated: each Generator rank also hosts a Trainer."""
    lockstep: bool
    """mode.env_level off: all groups of a lockstep component advance together (sync baseline)."""
    weights_tree: tuple[tuple[int | None, tuple[int, ...]], ...] = ()
    """The publish's relay tree (relay_tree) as ranks: (parent rank, child ranks)
    of Trainer 0 (first, parent None) and then of each Generator in gen_ranks' order."""

    def publish_children(self) -> tuple[int, ...]:
        """The Generators Trainer 0 sends a publish (and Stop) to itself."""
        return self.weights_tree[0][1]

    def relay_parent(self, gen_rank: int) -> int:
        """Where Generator `gen_rank` receives a publish (and Stop) from: Trainer 0 or a Generator."""
        return self.weights_tree[1 + self.gen_ranks.index(gen_rank)][0]

    def relay_children(self, gen_rank: int) -> tuple[int, ...]:
        """The Generators Generator `gen_rank` forwards a publish (and Stop) to."""
        return self.weights_tree[1 + self.gen_ranks.index(gen_rank)][1]

    def roles_of(self, rank: int) -> list[str]:
        """The roles `rank` plays (two when colocated: generator and trainer)."""
        return [r for r, ranks in zip(ROLES, (self.sim_ranks, self.gen_ranks, self.train_ranks)) if rank in ranks]

    def role_name(self, rank: int) -> str:
        return "+".join(self.roles_of(rank))

    def groups_of_sim(self, rank: int) -> list[Group]:
        return [g for g in self.groups if g.sim_rank == rank]

    def groups_of_gen(self, gen_index: int) -> list[Group]:
        return [g for g in self.groups if g.gen_index == gen_index]

    def gen_rank_of(self, g: Group) -> int:
        return self.gen_ranks[g.gen_index]


def sharding_plan(cfg: RunConfig) -> list[list[int]]:
    """Group sizes per Simulator rank, from the named strategy or the explicit plan."""
    s, n, ranks = cfg.sharding, cfg.env.num_envs, cfg.cluster.sim_ranks
    if s.plan:
        return [list(r) for r in s.plan]
    per_rank = [n // ranks + (1 if r < n % ranks else 0) for r in range(ranks)]
    if s.strategy == "per_env":
        return [[1] * k for k in per_rank]
    if s.strategy == "aggregated":
        return [[k] for k in per_rank]
    if s.strategy == "pipelined":
        plan = []
        for k in per_rank:
            g = min(s.groups_per_rank, k)
            plan.append([k // g + (1 if i < k % g else 0) for i in range(g)])
        return plan
    raise ConfigError(f"sharding.strategy={s.strategy!r} is unknown; use per_env, pipelined or aggregated")


def assign_generators(sizes: list[int], n_gen: int) -> list[int]:
    """Greedy: each group (largest first) goes to the Generator serving the fewest envs so far."""
    load = [0] * n_gen
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        j = min(range(n_gen), key=lambda j: (load[j], j))
        owner[i] = j
        load[j] += sizes[i]
    return owner


def episodic(cfg: RunConfig) -> bool:
    """Whole episodes per segment (grpo, raft, evaluation): every env of a group resets at each segment
    start (`shared_reset`: all from one seed), and an env whose episode ended waits for that reset."""
    return ALGORITHMS[cfg.algo.name].episodic or cfg.runtime.evaluate


def shared_reset(cfg: RunConfig) -> bool:
    """grpo training: a group's envs reset from one seed (`group_seed`), so a GRPO group is one
    initial state. Never in evaluation: there each env resets from its own seeds, so N episodes
    are N distinct initial states, as the Wilson interval assumes."""
    return ALGORITHMS[cfg.algo.name].shared_reset and not cfg.runtime.evaluate


def group_seed(cfg: RunConfig, gid: int, seq: int) -> int:
    """The shared reset seed of group `gid`'s segment `seq` (episodic mode)."""
    return (cfg.seed * 1_000_003 + gid * 100_003 + seq * 7 + 1) % (2**31 - 1)


def relay_tree(n_generators: int, fanout: int) -> list[tuple[int | None, list[int]]]:
    """(parent, children) of every node of a weights publish: node 0 is Trainer 0, node i >= 1 the
    i-th Generator. fanout >= 1: a complete fanout-ary tree in Generator order (node i's children
    are i*fanout+1 .. i*fanout+fanout); fanout 0: every Generator a child of Trainer 0."""
    n = n_generators + 1
    if fanout == 0:
        return [(None, list(range(1, n)))] + [(0, []) for _ in range(1, n)]
    return [((i - 1) // fanout if i else None, [c for c in range(i * fanout + 1, i * fanout + fanout + 1) if c < n])
            for i in range(n)]


def derive(cfg: RunConfig) -> World:
    """Validate `cfg` and compute the layout. Raises ConfigError naming the bad field."""
    validate(cfg)
    c = cfg.cluster
    colocated = cfg.mode.placement == "colocated"
    sims = tuple(range(c.sim_ranks))
    gens = tuple(range(c.sim_ranks, c.sim_ranks + c.gen_ranks))
    trains = gens if colocated else tuple(range(gens[-1] + 1, gens[-1] + 1 + c.train_ranks))
    plan = sharding_plan(cfg)
    flat = [(r, size) for r, sizes in enumerate(plan) for size in sizes]
    owners = assign_generators([s for _, s in flat], c.gen_ranks)
    groups, offset = [], 0
    for gid, ((r, size), gen) in enumerate(zip(flat, owners)):
        groups.append(Group(gid, sims[r], size, offset, gen))
        offset += size
    a = cfg.algo
    per_epoch = a.rollout_batch // a.global_batch
    node_rank = (trains[0], *gens)   # relay_tree's nodes: Trainer 0, then the Generators
    tree = tuple((None if p is None else node_rank[p], tuple(node_rank[c] for c in kids))
                 for p, kids in relay_tree(len(gens), cfg.generator.weights_fanout))
    return World(
        size=len(sims) + len(gens) + (0 if colocated else len(trains)),
        sim_ranks=sims,
        gen_ranks=gens,
        train_ranks=trains,
        groups=tuple(groups),
        segments_per_step=a.rollout_batch // (cfg.env.num_envs * a.segment_steps),
        opt_steps_per_epoch=per_epoch,
        opt_steps_per_version=a.update_epochs * per_epoch,
        b_max=min(cfg.generator.b_max, cfg.policy.max_batch),
        execute_steps=execute_steps(cfg.policy),
        episodic=episodic(cfg),
        shared_reset=shared_reset(cfg),
        in_process_envs=in_process(cfg),
        colocated=colocated,
        lockstep=not cfg.mode.env_level,
        weights_tree=tree,
    )


def run_records(cfg: RunConfig) -> dict[str, dict]:
    """Files the launcher writes into a run folder beside the config, by env: LIBERO's
    init_states.json (which initial states the run trains or evaluates on)."""
    if cfg.env.name == "libero":
        from .envs.libero_env import state_split

        return {"init_states.json": state_split(cfg)}
    return {}


def success_hint(cfg: RunConfig) -> list[str]:
    """What a good success value is, where the env has a measured one (toy: chance and learned)."""
    if cfg.env.name != "toy" or cfg.runtime.evaluate:
        return []
    from .envs.toy import SUCCESS_HINT

    return [SUCCESS_HINT]


def check_env(cfg: RunConfig) -> None:
    """The env's interpreter hosts it and its simulator accepts the named task, suite, robot and
    cameras (the launcher's check: it starts that interpreter, so it is not part of `validate`,
    which every rank runs)."""
    from .envs.hosting import check_env as check_in_interpreter

    try:
        check_in_interpreter(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def validate(cfg: RunConfig) -> None:
    """Every check before a rank starts (checks.py); the first bad value raises ConfigError."""
    checks.validate(cfg, sharding_plan)


def plan_table(world: World) -> str:
    """The sharding plan as a table, printed at start-up."""
    lines = ["group  sim_rank  envs  env_ids      generator_rank"]
    for g in world.groups:
        ids = f"{g.env_offset}..{g.env_offset + g.size - 1}"
        lines.append(f"{g.gid:5d}  {g.sim_rank:8d}  {g.size:4d}  {ids:11s}  {world.gen_rank_of(g):14d}")
    return "\n".join(lines)

