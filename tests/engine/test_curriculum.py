"""env.task_sampling (engine/curriculum.py): a multi-task GRPO run's choice of each group's task."""
from __future__ import annotations

import numpy as np
import pytest

from rlvla3.cluster.compose import compose
from rlvla3.config import ConfigError
from rlvla3.engine.curriculum import TaskCurriculum
from rlvla3.engine.history import task_success
from rlvla3.engine.protocol import ShardReady
from rlvla3.envs.libero_env import episode_of
from rlvla3.world import validate


def drawn_tasks(c: TaskCurriculum, n: int = 4000) -> np.ndarray:
    seeds = np.random.default_rng(0).integers(0, 2**31 - 1, n)
    return np.array([episode_of(c.seed_for(int(s)), c.task_ids)[0] for s in seeds])


def test_failure_sampling_draws_failing_tasks_more_and_starves_none():
    c = TaskCurriculum([3, 5, 7, 9], "failure", floor=0.1, window=10)
    for _ in range(10):
        c.record(3, True)    # learned: weight at the floor
        c.record(5, False)   # failing
        c.record(7, _ % 2 == 0)   # half
    # 9 never seen: counts as failing
    np.testing.assert_allclose(c.weights(), np.array([0.1, 1.0, 0.5, 1.0]) / 2.6)
    counts = np.bincount(drawn_tasks(c), minlength=10)[[3, 5, 7, 9]] / 4000
    np.testing.assert_allclose(counts, c.weights(), atol=0.03)
    assert counts[0] > 0.02   # the learned task is still rehearsed
    for _ in range(10):
        c.record(5, True)      # the window forgets the failures
    np.testing.assert_allclose(c.weights(), np.array([0.1, 0.1, 0.5, 1.0]) / 1.7)


def test_a_chosen_task_keeps_the_seeds_initial_state_and_uniform_keeps_the_seed():
    c = TaskCurriculum([0, 1, 2], "failure", floor=0.2, window=4)
    for seed in (0, 7, 12345, 2**31 - 2):
        moved = c.seed_for(seed)
        assert moved // 3 == seed // 3 and episode_of(moved, c.task_ids)[1] == episode_of(seed, c.task_ids)[1]
        assert c.seed_for(seed) == moved   # deterministic for a record
    u = TaskCurriculum([0, 1, 2], "uniform", floor=0.2, window=4)
    assert [u.seed_for(s) for s in (0, 7, 12345)] == [0, 7, 12345]
    np.testing.assert_allclose(u.weights(), [1 / 3] * 3)


def test_per_task_success_sums_the_versions_shards():
    def shard(stats):
        return ShardReady("s", 0, 0, 0, 4, 0, 0, 4, task_stats=stats)

    got = task_success([shard({0: [2, 1], 3: [1, 1]}), shard({0: [2, 2]}), shard({})])
    assert got == {"success_task0": 0.75, "episodes_task0": 4, "success_task3": 1.0, "episodes_task3": 1}


def test_failure_sampling_is_refused_where_it_cannot_choose():
    libero = ["+experiment=libero_object_grpo", "env.task_sampling=failure"]
    with pytest.raises(ConfigError, match=r"env\.task_sampling.*at least two env\.task_ids"):
        validate(compose([*libero, "env.task_ids=[0]"]))
    with pytest.raises(ConfigError, match=r"env\.task_sampling.*algo=ppo resets each env from its own seed"):
        validate(compose([*libero, "algo=ppo", "env.task_ids=[0,1]"]))
    with pytest.raises(ConfigError, match=r"env\.task_sampling_floor"):
        validate(compose([*libero, "env.task_ids=[0,1]", "env.task_sampling_floor=0"]))
    validate(compose([*libero, "env.task_ids=[0,1]"]))
