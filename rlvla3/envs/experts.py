"""Scripted experts for the robosuite tasks: phase machines on privileged state (object and
end-effector positions), the demonstrators of `python -m rlvla3.collect`.

An expert reads the simulator's raw observation dict, never the policy's input, and runs inside
the env's own process. Each phase has a waypoint; position control is proportional toward it,
a[:3] = clip(GAIN * (waypoint - eef), -1, 1) (OSC_POSE: 1 = 5 cm per step), no rotation, and
the gripper -1 open / +1 closed. A phase ends when its waypoint is within its tolerance, or
after a fixed number of steps (grasp, release).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

GAIN = 10.0


@dataclass
class Phase:
    name: str
    waypoint: Callable[[dict], np.ndarray]   # raw obs -> xyz
    gripper: float                           # -1 open, +1 closed
    tolerance: float | None = 0.01           # m; None: the phase lasts `steps`
    steps: int = 0
    max_steps: int = 40                      # a waypoint not reached by then (contact) is left


class PhaseExpert:
    def __init__(self, env):
        self.env = env
        self.reset()

    def reset(self) -> None:
        self.index, self.t, self.anchor = 0, 0, None

    def phases(self) -> list[Phase]:
        raise NotImplementedError

    def anchored(self, offset) -> Callable[[dict], np.ndarray]:
        """A waypoint fixed where the end effector was when the phase began, plus `offset`."""
        def fn(raw):
            if self.anchor is None or self.anchor[0] != self.index:
                self.anchor = (self.index, raw["robot0_eef_pos"].copy())
            return self.anchor[1] + offset
        return fn

    def act(self, raw: dict) -> np.ndarray:
        phases = self.phases()
        eef = raw["robot0_eef_pos"]
        while True:
            p = phases[self.index]
            target = p.waypoint(raw)
            reached = p.tolerance is not None and np.linalg.norm(target - eef) < p.tolerance
            timed = self.t >= (p.steps if p.tolerance is None else p.max_steps)
            if (reached or timed) and self.index < len(phases) - 1:
                self.index, self.t = self.index + 1, 0
                continue
            break
        self.t += 1
        a = np.zeros(7)
        a[:3] = np.clip(GAIN * (target - eef), -1.0, 1.0)
        a[6] = p.gripper
        return a


class PickPlace(PhaseExpert):
    """Pick the object at raw[`obj`]; lift it, or carry it above `place(raw)` and release it."""

    obj = "cube_pos"
    lift = 0.20            # m above the grasp
    release_height = 0.08  # m above the place target

    def place(self, raw) -> np.ndarray | None:
        return None

    def phases(self) -> list[Phase]:
        at = lambda dz: (lambda raw: raw[self.obj] + [0.0, 0.0, dz])  # noqa: E731
        out = [Phase("hover", at(0.10), -1.0),
               Phase("descend", at(0.0), -1.0, tolerance=0.008),
               Phase("grasp", self.anchored(0.0), 1.0, tolerance=None, steps=12),
               Phase("lift", self.anchored(np.array([0.0, 0.0, self.lift])), 1.0, tolerance=0.02)]
        if self.place(None) is None:
            return out
        over = lambda dz: (lambda raw: self.place(raw) + [0.0, 0.0, dz])  # noqa: E731
        return out + [Phase("carry", over(self.lift), 1.0, tolerance=0.015),
                      Phase("lower", over(self.release_height), 1.0, tolerance=0.012),
                      Phase("release", self.anchored(0.0), -1.0, tolerance=None, steps=10),
                      Phase("retreat", self.anchored(np.array([0.0, 0.0, 0.08])), -1.0)]


class LiftExpert(PickPlace):
    obj = "cube_pos"


class StackExpert(PickPlace):
    obj = "cubeA_pos"
    release_height = 0.055

    def place(self, raw):
        return np.zeros(3) if raw is None else raw["cubeB_pos"]


class PickPlaceCanExpert(PickPlace):
    obj = "Can_pos"
    release_height = 0.12

    def place(self, raw):
        return np.array(self.env.target_bin_placements[self.env.object_to_id["can"]])


EXPERTS = {"Lift": LiftExpert, "Stack": StackExpert, "PickPlaceCan": PickPlaceCanExpert}
