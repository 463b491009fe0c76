"""The policy families, in one table: what `policy.name` may be, which class builds each (random
init, or from a released folder), what it samples, and what it reads from a released folder.
Config validation, the builder (`policies.family`), the sample layouts, the benchmarks and the
docs' tests read it; nothing else lists the families. numpy-free and torch-free: Simulators and
the launcher read it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    model: str | None
    """module:class (under rlvla3.policies) built at random init; None: no random-init form."""
    released: str | None
    """module:class built from `policy.pretrained` (and at the published size); None: no released folder."""
    samples: str
    """What one forward samples (policies/sampling.py): tokens | chain | gaussian."""
    reads: str
    """What a released folder holds that the family reads (the docs' policies page says more)."""
    prompt: str | None = None
    """module:function (torch-free) giving the family's instruction encoder for a `policy` config,
    or None there: the project's hashed words (policies/prompts.py)."""
    horizon: str | None = None
    """module:function (torch-free) giving how many actions of a chunk a released folder says to
    execute (None where it says nothing), or None: the folder never says."""
    torch: bool = True


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("tiny", "tiny:TinyVLA", None, "tokens", "nothing: random init or an SFT/RL checkpoint"),
    Family("openvla", "openvla.model:OpenVLA", "openvla.released:ReleasedOpenVLA", "tokens",
           "a Prismatic folder (openvla/openvla-7b and its fine-tunes): sharded safetensors, config.json, norm_stats",
           "openvla.layout:encoder"),
    Family("openvla_oft", None, "openvla.oft:ReleasedOFT", "gaussian",
           "an OpenVLA-OFT fine-tune: the Prismatic folder + action head + proprio projector + dataset_statistics.json",
           "openvla.layout:encoder"),
    Family("pi0", "pi.pi0:Pi0Flow", "pi.pi0:Pi0Flow", "chain",
           "transformers' or LeRobot's PI0 folder + LeRobot normaliser files; PaliGemma's tokenizer", "pi.layout:pi0_encoder",
           "pi.layout:execute_steps"),
    Family("pi05", "pi.pi05:Pi05Flow", "pi.pi05:Pi05Flow", "chain",
           "LeRobot's π0.5 folder (lerobot/pi05_base layout) + normaliser files; PaliGemma's tokenizer", "pi.layout:pi05_encoder",
           "pi.layout:execute_steps"),
    Family("smolvla", "smolvla.policy:SmolVLAFlow", "smolvla.policy:SmolVLAFlow", "chain",
           "LeRobot's SmolVLA folder (lerobot/smolvla_base layout) + normaliser files; SmolVLM2's tokenizer",
           "smolvla.layout:encoder", "pi.layout:execute_steps"),
    Family("gr00t", "gr00t.policy:Gr00tFlow", "gr00t.policy:Gr00tFlow", "chain",
           "a GR00T N1.5 folder (nvidia/GR00T-N1.5-3B layout) + experiment_cfg/metadata.json; Eagle 2.5's tokenizer",
           "gr00t.layout:encoder"),
    Family("emulated", None, None, "tokens", "nothing: sleeps for a planner profile's costs", torch=False),
)}


def family_names(where=lambda f: True) -> tuple[str, ...]:
    return tuple(name for name, f in FAMILIES.items() if where(f))


PUBLISHED = family_names(lambda f: f.released is not None)
"""Families with a published configuration (a released folder's layout at its real size)."""
