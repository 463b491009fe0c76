"""Scripted experts for LIBERO's pick-and-place tasks, read from the task's own BDDL goal.

A goal `(In obj target_region)` or `(On obj target)` names what to pick and where it goes, so one
phase machine (experts.PickPlace's phases) takes every task of that shape: all ten of
libero_object ("pick up the X and place it in the basket"), all ten of libero_spatial ("pick up
the black bowl ... and place it on the plate") and eight of libero_goal. Whether it succeeds is
per task (the bowl inside libero_spatial 4's drawer is out of its reach). The expert reads
privileged state (object positions from the simulator), never the policy's input, and runs in
the LIBERO env's process (robosuite 1.4 under `.venv-libero`), like the robosuite experts.

Where to hold an object is its shape, read from its collision geoms: a bowl is pinched at its
rim on the +y side (the fingers close along y and straddle the wall; the hand never turns),
anything else from above, 3 cm below its top (flat ones at the fingertips), slid along x until
the 20 cm wide hand comes down clear of tall neighbours.
"""
from __future__ import annotations

import numpy as np

from .experts import Phase, PickPlace

GRIP_ABOVE_TIPS = 0.006  # m from the fingertips up to the grip site (eef), measured on LIBERO's Panda
# The hand's collision box about the grip site, fingers open (x: across the fingers, y: the
# closing axis; the fingertip pads reach 5 mm below the site, the hand starts 2.4 cm above it).
HAND_LOW, HAND_HIGH = np.array([-0.03, -0.104, 0.024]), np.array([0.038, 0.104, 0.126])
PLACE_CLEARANCE = 0.06   # m the held object's bottom stays above the target's top while carried


def has_expert(goal: list) -> bool:
    """Whether a task's BDDL goal (robosuite_parse_problem's goal_state) is one this expert does:
    a single `In obj region` or `On obj target`."""
    return len(goal) == 1 and len(goal[0]) == 3 and goal[0][0].lower() in ("in", "on")


class LiberoPickPlace(PickPlace):
    """Pick the goal's object and put it in or on the goal's target (an object or a region's site).
    Success rates per task are measured by `python -m rlvla3.collect` (docs/results/libero.md)."""

    lift = 0.12

    def __init__(self, env):
        """`env`: LIBERO's robosuite-level env (OffScreenRenderEnv.env), whose BDDL goal names the objects."""
        goal = env.parsed_problem["goal_state"]
        if not has_expert(goal):
            raise NotImplementedError(f"LIBERO goal {goal}: the scripted expert does pick-and-place goals "
                                      "(one `In obj region` or `On obj target`)")
        self.relation, self.obj_name, self.target = goal[0][0].lower(), goal[0][1], goal[0][2]
        self.obj = f"{self.obj_name}_pos"
        self._geoms: dict[str, list[int]] = {}
        super().__init__(env)

    # -- geometry read from the simulator -------------------------------------------------------

    def _body_geoms(self, body: str) -> list[int]:
        """Collision geoms of object `body` and its sub-bodies. The model is fixed for the episode
        (an expert lives one episode), so each body's list is found once, not at every step."""
        if body not in self._geoms:
            sim = self.env.sim
            root = self.env.obj_body_id[body]
            bodies = {root} | {b for b in range(sim.model.nbody) if self._descends(b, root)}
            self._geoms[body] = [g for g in range(sim.model.ngeom) if sim.model.geom_bodyid[g] in bodies
                                 and sim.model.geom_contype[g] + sim.model.geom_conaffinity[g] > 0]
        return self._geoms[body]

    def _descends(self, b: int, root: int) -> bool:
        parent = self.env.sim.model.body_parentid
        while b not in (0, root):
            b = parent[b]
        return b == root

    def _extent(self, body: str) -> tuple[np.ndarray, np.ndarray]:
        """World-frame bounding box (low, high corners) of a body's collision geoms, from each
        geom's own bounding box (MuJoCo's geom_aabb: centre and half sizes in the geom's frame)."""
        sim = self.env.sim
        lows, highs = [], []
        for g in self._body_geoms(body):
            rot = sim.data.geom_xmat[g].reshape(3, 3)
            centre = sim.data.geom_xpos[g] + rot @ sim.model.geom_aabb[g][:3]
            half = np.abs(rot) @ sim.model.geom_aabb[g][3:]
            lows.append(centre - half)
            highs.append(centre + half)
        return np.min(lows, axis=0), np.max(highs, axis=0)

    def is_bowl(self) -> bool:
        return "bowl" in self.obj_name

    # -- waypoints ------------------------------------------------------------------------------

    def grasp_point(self, raw) -> np.ndarray:
        low, high = self._extent(self.obj_name)
        centre = (low + high) / 2
        if self.is_bowl():   # the rim on the +y side (toward the robot's right), fingers across the wall
            return np.array([centre[0], high[1] - 0.02, high[2] - 0.025])
        # The grip site is ~5 mm above the fingertips: a flat object (cream cheese, 1.8 cm) is held
        # with the tips at the floor; taller ones 3 cm below their top.
        z = max(high[2] - 0.03, low[2] + GRIP_ABOVE_TIPS)
        if self.shift is None:   # chosen once, before the hand moves anything
            self.shift = self.clear_shift(centre, low, high, z)
        return np.array([centre[0] + self.shift, centre[1], z])

    def clear_shift(self, centre, low, high, z: float) -> float:
        """How far along x (the axis the fingers do not close on) to hold the object so the hand,
        20 cm wide along the closing axis, comes down clear of its neighbours: the shift (within
        the object's length, tips 1.2 cm from its ends) whose hand box overlaps them least, the
        smallest such. A tall box of ketchup beside flat cream cheese blocks a centred hand."""
        reach = max(0.0, (high[0] - low[0]) / 2 - 0.012)
        others = [self._extent(name) for name in self.env.objects_dict if name != self.obj_name]

        def overlap(shift: float) -> float:
            hand_low = np.array([centre[0] + shift, centre[1], z]) + HAND_LOW
            hand_high = np.array([centre[0] + shift, centre[1], z]) + HAND_HIGH
            return sum(np.prod(np.clip(np.minimum(hi, hand_high) - np.maximum(lo, hand_low), 0.0, None))
                       for lo, hi in others)

        shifts = sorted(np.linspace(-reach, reach, 2 * int(reach / 0.005) + 1), key=abs)
        return float(min(shifts, key=overlap)) if reach > 0 else 0.0

    def place_point(self) -> np.ndarray:
        """Where the grasp point goes, before the carry and drop heights: the target's centre (a
        region's site; an object's top face) plus the hand's offset from the held object's centre,
        so the object, not the fingers, ends up centred."""
        sim = self.env.sim
        if self.target in self.env.object_sites_dict:   # a region: the basket's inside, a stove's cook region
            centre = sim.data.get_site_xpos(self.target).copy()
        else:
            low, high = self._extent(self.target)
            centre = np.array([(low[0] + high[0]) / 2, (low[1] + high[1]) / 2, high[2]])
        return centre + self.offset

    def phases(self) -> list[Phase]:
        grasp = self.grasp_point
        out = [Phase("hover", lambda raw: grasp(raw) + [0.0, 0.0, 0.08], -1.0, tolerance=0.015),
               Phase("descend", grasp, -1.0, tolerance=0.005),
               Phase("grasp", self.anchored(0.0), 1.0, tolerance=None, steps=12),
               Phase("lift", self.noting_the_hold(np.array([0.0, 0.0, self.lift])), 1.0, tolerance=0.02)]
        over = lambda dz: (lambda raw: self.place_point() + [0.0, 0.0, dz])  # noqa: E731
        return out + [Phase("carry", over(self.carry_height()), 1.0, tolerance=0.02, max_steps=60),
                      Phase("lower", over(self.drop_height()), 1.0, tolerance=0.012),
                      Phase("release", self.anchored(0.0), -1.0, tolerance=None, steps=10),
                      Phase("retreat", self.anchored(np.array([0.0, 0.0, 0.10])), -1.0)]

    def noting_the_hold(self, offset):
        """The lift's anchored waypoint; at its first step it notes where the hand holds the object
        (offset from its centre, height above its bottom), which the carry and drop heights use."""
        anchored = self.anchored(offset)

        def fn(raw):
            if self._noted != self.index:
                low, high = self._extent(self.obj_name)
                self.offset = np.array([0.0, 0.0, 0.0])
                self.offset[:2] = raw["robot0_eef_pos"][:2] - (low[:2] + high[:2]) / 2
                self.below = raw["robot0_eef_pos"][2] - low[2]   # grasp point above the object's bottom
                self._noted = self.index
            return anchored(raw)
        return fn

    def carry_height(self) -> float:
        """Grasp point above the place point while carrying: the object's bottom clear of the target."""
        return self.below + PLACE_CLEARANCE + (0.05 if self.relation == "on" else 0.08)

    def drop_height(self) -> float:
        """Grasp point above the place point where the hand lets go: the object resting on the target's
        top (On), or a little inside the region (In)."""
        return self.below + (0.01 if self.relation == "on" else 0.03)

    def reset(self) -> None:
        super().reset()
        self.offset, self.below, self._noted, self.shift = np.zeros(3), 0.05, None, None
