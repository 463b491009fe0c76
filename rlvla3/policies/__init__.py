"""VLA policy families behind one interface (`base.Policy`). Imports torch: never import this
package from a Simulator rank."""
from __future__ import annotations


def make_policy(cfg, spec):
    """The policy of `cfg.policy` for observations/actions of `spec` (random init, seeded)."""
    if cfg.policy.name == "tiny":
        from .tiny import TinyVLA
        return TinyVLA(cfg.policy, spec)
    raise ValueError(f"policy.name={cfg.policy.name!r} is unknown; use tiny")
