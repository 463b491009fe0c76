"""`toy`: reach the named coloured square on a small rendered grid.

A target (and `env.distractors` targets of other colours) and the agent are placed at random on a grid of `env.grid`
cells. The image is egocentric: a (2*grid - 1)-cell view centred on the agent (white) on black, so the
direction to a target is where it appears relative to the centre. Cells outside the grid are
left black on purpose: painting them made the picture change with the agent's position and
slowed learning several-fold (the walls are in the proprio anyway). The instruction names one target ("go to the red square").
Action: 2-D in [-1, 1], each coordinate moves the agent -1/0/+1 cell (dead zone |a| < 1/3).
Reward 1 and success when the agent reaches the named target, plus a potential-based shaping
term 0.1 * (distance before - distance after) (Ng et al. 1999: it leaves the optimal policy
unchanged and speeds learning). Small enough that the tiny VLA
learns it (language + vision) in about a minute on one core.
"""
from __future__ import annotations

import numpy as np

from .base import Obs

PROPRIO_DIM = 2
ACTION_DIM = 2
COLORS = {"red": (230, 40, 40), "green": (40, 200, 40), "blue": (50, 80, 240), "yellow": (230, 210, 30)}


SUCCESS_HINT = ("on toy a uniform-random policy succeeds ~0.21 of the time; PPO's success climbs past 0.45 within "
                "about 30 versions and ends near 0.5-0.7 (+experiment=toy: 50 versions, about 2 minutes on 2 cores)")
"""What a good value is, printed by the launcher under the success line (measured: docs/results/manipulation.md)."""


class ToyEnv:
    def __init__(self, cfg_env):
        self.g, self.size = cfg_env.grid, cfg_env.image_size
        self.view = 2 * self.g - 1
        if self.size % self.view:
            raise ValueError(f"env.image_size={self.size} must be a multiple of 2 * env.grid - 1 = {self.view} for env=toy")
        self.cell = self.size // self.view
        self.distractors = cfg_env.distractors
        if not 0 <= self.distractors < len(COLORS):
            raise ValueError(f"env.distractors={self.distractors} must be in 0..{len(COLORS) - 1}")
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int) -> Obs:
        self.rng = np.random.default_rng(seed)
        k = 1 + self.distractors
        cells = self.rng.choice(self.g * self.g, size=1 + k, replace=False)
        self.agent = np.array(divmod(int(cells[0]), self.g))
        names = self.rng.choice(list(COLORS), size=k, replace=False)
        self.targets = {str(n): np.array(divmod(int(c), self.g)) for n, c in zip(names, cells[1:])}
        self.goal = str(names[self.rng.integers(k)])
        return self._obs()

    def step(self, action: np.ndarray, observe: bool = True):
        move = (action[:2] > 1 / 3).astype(int) - (action[:2] < -1 / 3).astype(int)
        before = self._distance()
        self.agent = np.clip(self.agent + move, 0, self.g - 1)
        success = bool((self.agent == self.targets[self.goal]).all())
        reward = float(success) + 0.1 * (before - self._distance())
        return self._obs(), reward, success, success, 0.0

    def expert_action(self) -> np.ndarray:
        """The scripted expert: one move straight (or diagonally) toward the named target."""
        return np.sign(self.targets[self.goal] - self.agent).astype(np.float32)

    def _distance(self) -> int:
        """Moves needed to reach the goal (diagonal moves allowed)."""
        return int(np.abs(self.agent - self.targets[self.goal]).max())

    def _obs(self) -> Obs:
        img = np.zeros((self.size, self.size, 3), np.uint8)
        off = self.g - 1 - self.agent  # world cell (r, c) appears at view cell (r, c) + off
        for name, (r, c) in self.targets.items():
            self._paint(img, r + off[0], c + off[1], COLORS[name])
        self._paint(img, self.g - 1, self.g - 1, (255, 255, 255))
        proprio = (self.agent / (self.g - 1) * 2 - 1).astype(np.float32)
        return Obs(img[None], proprio, f"go to the {self.goal} square")

    def _paint(self, img, r, c, color) -> None:
        k = self.cell
        img[r * k:(r + 1) * k, c * k:(c + 1) * k] = color
