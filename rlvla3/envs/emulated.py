"""`emulated`: an env whose step and reset latencies are drawn from a profile, without
using CPU. It lets the real runtime (MPI, batching, shards, training) run many envs on few
cores, with the heavy-tailed step times and slow resets real simulators have, so throughput
can be measured where the simulator itself is not the point.

Step latency ~ LogNormal(log(step_ms), step_sigma); episodes last exactly `horizon` steps (as
the planner's profiles assume) and every episode end adds `reset_ms`. Observations are random
frames; the last step succeeds (reward 1, terminated) with probability `success_rate`.
"""
from __future__ import annotations

import numpy as np

from .base import Obs


class EmulatedEnv:
    def __init__(self, cfg_env, env_id: int):
        self.c = cfg_env
        self.rng = np.random.default_rng(env_id)
        self.reset_delay = cfg_env.reset_ms / 1000.0
        self._img = np.zeros((1, cfg_env.image_size, cfg_env.image_size, 3), np.uint8)

    def reset(self, seed: int) -> Obs:
        self.rng = np.random.default_rng(seed)
        self.t = 0
        return self._obs()

    def step(self, action: np.ndarray, observe: bool = True):
        delay = self.c.step_ms / 1000.0 * float(np.exp(self.c.step_sigma * self.rng.standard_normal()))
        self.t += 1
        success = self.t >= self.c.horizon and bool(self.rng.random() < self.c.success_rate)
        return self._obs(), float(success), success, success, delay

    def _obs(self) -> Obs:
        self._img[...] = self.rng.integers(0, 256, size=3, dtype=np.uint8)
        proprio = self.rng.standard_normal(self.c.proprio_dim).astype(np.float32)
        return Obs(self._img.copy(), proprio, "emulated task")
