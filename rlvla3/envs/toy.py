"""`toy`: reach the named coloured square on a small rendered grid.

A grid of `env.grid` cells is rendered into an RGB image; two targets of different colours and
a white agent are placed at random. The instruction names one target ("go to the red square").
Action: 2-D in [-1, 1], each coordinate moves the agent -1/0/+1 cell (dead zone |a| < 1/3).
Reward 1 and success when the agent reaches the named target. Small enough that the tiny VLA
learns it (language + vision) in about a minute on one core.
"""
from __future__ import annotations

import numpy as np

from .base import Obs

PROPRIO_DIM = 2
ACTION_DIM = 2
COLORS = {"red": (230, 40, 40), "green": (40, 200, 40), "blue": (50, 80, 240), "yellow": (230, 210, 30)}


class ToyEnv:
    def __init__(self, cfg_env):
        self.g, self.size = cfg_env.grid, cfg_env.image_size
        if self.size % self.g:
            raise ValueError(f"env.image_size={self.size} must be a multiple of env.grid={self.g} for env=toy")
        self.cell = self.size // self.g
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int) -> Obs:
        self.rng = np.random.default_rng(seed)
        cells = self.rng.choice(self.g * self.g, size=3, replace=False)
        self.agent = np.array(divmod(int(cells[0]), self.g))
        names = self.rng.choice(list(COLORS), size=2, replace=False)
        self.targets = {str(n): np.array(divmod(int(c), self.g)) for n, c in zip(names, cells[1:])}
        self.goal = str(names[self.rng.integers(2)])
        return self._obs()

    def step(self, action: np.ndarray):
        move = (action[:2] > 1 / 3).astype(int) - (action[:2] < -1 / 3).astype(int)
        self.agent = np.clip(self.agent + move, 0, self.g - 1)
        success = bool((self.agent == self.targets[self.goal]).all())
        return self._obs(), float(success), success, success, 0.0

    def _obs(self) -> Obs:
        img = np.zeros((self.size, self.size, 3), np.uint8)
        for name, (r, c) in self.targets.items():
            self._paint(img, r, c, COLORS[name])
        self._paint(img, *self.agent, (255, 255, 255))
        proprio = (self.agent / (self.g - 1) * 2 - 1).astype(np.float32)
        return Obs(img[None], proprio, f"go to the {self.goal} square")

    def _paint(self, img, r, c, color) -> None:
        k = self.cell
        img[r * k:(r + 1) * k, c * k:(c + 1) * k] = color
