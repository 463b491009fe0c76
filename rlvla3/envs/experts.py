"""Scripted experts for the robosuite tasks: phase machines on privileged state (object and
end-effector positions), the demonstrators of `python -m rlvla3.collect`.

An expert reads the simulator's raw observation dict, never the policy's input, and runs inside
the env's own process. Each phase has a waypoint; position control is proportional toward it,
a[:3] = clip(GAIN * (waypoint - eef), -1, 1) (OSC_POSE: 1 = 5 cm per step), no rotation unless
the phase sets a target orientation (a[3:6] = clip(ROT_GAIN * axis-angle error), 1 = 0.5 rad per
step), and the gripper -1 open / +1 closed. A phase ends when its waypoint (and orientation) is
within its tolerance, when its own `done` test on the state holds, or after a fixed number of
steps (grasp, release).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

GAIN = 10.0
ROT_GAIN = 1.5   # OSC_POSE turns 0.5 rad per unit: 1.5 asks for 3/4 of the error per step


@dataclass
class Phase:
    name: str
    waypoint: Callable[[dict], np.ndarray]   # raw obs -> xyz
    gripper: float                           # -1 open, +1 closed
    tolerance: float | None = 0.01           # m; None: the phase lasts `steps`
    steps: int = 0
    max_steps: int = 40                      # a waypoint not reached by then (contact) is left
    orientation: Callable[[dict], np.ndarray] | None = None  # raw obs -> end-effector rotation matrix
    ori_tolerance: float = 0.1               # rad, with `orientation`
    done: Callable[[dict], bool] | None = None  # replaces the tolerance test: the phase's goal is a state


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
            turn = np.zeros(3) if p.orientation is None else rotation_error(p.orientation(raw), eef_rotation(raw))
            if p.done is not None:
                reached = p.done(raw)
            else:
                reached = (p.tolerance is not None and np.linalg.norm(target - eef) < p.tolerance
                           and np.linalg.norm(turn) < p.ori_tolerance)
            timed = self.t >= (p.steps if p.tolerance is None else p.max_steps)
            if (reached or timed) and self.index < len(phases) - 1:
                self.index, self.t = self.index + 1, 0
                continue
            break
        self.t += 1
        a = np.zeros(7)
        a[:3] = np.clip(GAIN * (target - eef), -1.0, 1.0)
        a[3:6] = np.clip(ROT_GAIN * turn, -1.0, 1.0)
        a[6] = p.gripper
        return a


def rotation(axis, angle: float) -> np.ndarray:
    """The rotation matrix of `angle` rad about `axis` (Rodrigues)."""
    x, y, z = np.asarray(axis, float) / np.linalg.norm(axis)
    k = np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])
    return np.eye(3) + np.sin(angle) * k + (1.0 - np.cos(angle)) * k @ k


def rotation_error(want: np.ndarray, have: np.ndarray) -> np.ndarray:
    """Axis-angle (world frame) of the rotation taking `have` to `want`: OSC_POSE's delta
    orientation input (its base frame is the world's for a table-mounted arm)."""
    r = want @ have.T
    angle = np.arccos(np.clip((np.trace(r) - 1.0) / 2.0, -1.0, 1.0))
    if angle < 1e-6:
        return np.zeros(3)
    return angle / (2.0 * np.sin(angle)) * np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])


def eef_rotation(raw: dict) -> np.ndarray:
    """The grip site's rotation matrix, from its (x, y, z, w) quaternion: the frame OSC_POSE turns
    (columns: x the fingers' closing axis, z pointing out of the fingers)."""
    x, y, z, w = np.asarray(raw["robot0_eef_quat_site"], float)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


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


class DoorExpert(PhaseExpert):
    """Open robosuite's Door: grasp the handle from the front, turn it down until the latch clears
    the frame, then pull the handle around the door's hinge.

    A top grasp is impossible: with the fingers closing across the bar the hand is 20 cm wide and
    hits the door first. So the gripper is turned to point into the door with its fingers closing
    vertically on the 4 cm tall bar. Turning and pulling are rotations (about the latch's and the
    door's hinge axes): each step's waypoint is the end effector carried `LEAD` rad further along
    its circle about that axis, and the hand turns with it, since a straight pull drags the grasp
    off the handle. Axes, anchors and the handle's frame are read from the simulator."""

    LEAD = 0.3          # rad ahead on the arc: far enough to push past the latch's friction
    UNLATCHED = 1.35    # rad of handle turn: the latch clears the frame from about 1.25 (limit 1.57)
    STANDOFF = 0.10     # m in front of the handle, where the hand lines up before reaching in

    # The grip site's axes in the handle (latch body) frame, whose y points into the door and z up:
    # fingers closing along -z, the site's y along -x, and pointing (site z) into the door.
    GRASP_IN_LATCH = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])

    def _joint(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Anchor and axis (world) of the door's joint i: 0 the door's hinge, 1 the latch."""
        sim = self.env.sim
        j = sim.model.joint_name2id(self.env.door.joints[i])
        return sim.data.xanchor[j].copy(), sim.data.xaxis[j].copy()

    def _latch_frame(self) -> np.ndarray:
        sim = self.env.sim
        return sim.data.xmat[sim.model.body_name2id(self.env.door.latch_body)].reshape(3, 3).copy()

    def grasp_orientation(self, raw) -> np.ndarray:
        return self._latch_frame() @ self.GRASP_IN_LATCH

    def in_front_of_handle(self, distance: float) -> Callable[[dict], np.ndarray]:
        return lambda raw: raw["handle_pos"] - distance * self._latch_frame()[:, 1]

    def arc_step(self, joint: int) -> Callable[[dict], np.ndarray]:
        """The end effector carried LEAD rad about door joint `joint` (its opening direction)."""
        def fn(raw):
            anchor, axis = self._joint(joint)
            return anchor + rotation(axis, self.LEAD) @ (raw["robot0_eef_pos"] - anchor)
        return fn

    def arc_orientation(self, joint: int) -> Callable[[dict], np.ndarray]:
        """The grasp's orientation turned LEAD rad about door joint `joint`, as the hand follows."""
        return lambda raw: rotation(self._joint(joint)[1], self.LEAD) @ self.grasp_orientation(raw)

    def phases(self) -> list[Phase]:
        grasp = self.grasp_orientation
        out = [Phase("align", self.in_front_of_handle(self.STANDOFF), -1.0, tolerance=0.015,
                     max_steps=60, orientation=grasp),
               Phase("reach", self.in_front_of_handle(0.0), -1.0, orientation=grasp),
               Phase("grasp", self.anchored(0.0), 1.0, tolerance=None, steps=10, orientation=grasp)]
        if self.env.use_latch:   # without a latch the handle is fixed and the door swings freely
            out.append(Phase("turn", self.arc_step(1), 1.0, max_steps=80, orientation=self.arc_orientation(1),
                             done=lambda raw: raw["handle_qpos"] > self.UNLATCHED))
        return out + [Phase("pull", self.arc_step(0), 1.0, orientation=self.arc_orientation(0))]


EXPERTS = {"Lift": LiftExpert, "Stack": StackExpert, "PickPlaceCan": PickPlaceCanExpert, "Door": DoorExpert}
