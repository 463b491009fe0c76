"""The OpenVLA family: `openvla` (token actions) and `openvla_oft` (OFT's continuous action head).

- layout.py     torch-free: what a released Prismatic folder says (config, norm stats, the
                gripper's convention) and OpenVLA's prompt; the launcher and Simulators read it.
- prismatic.py  the released folder's model read natively onto transformers' classes (and written
                back in the same layout: tiny copies for tests).
- model.py      `openvla` random-initialised from `policy` sizes (RL from scratch, tests).
- released.py   `openvla` from a released folder (policy.pretrained) or at its published size.
- oft.py        `openvla_oft` from a released OFT folder or at its published size.
"""
