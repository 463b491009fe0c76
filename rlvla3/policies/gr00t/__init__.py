"""The `gr00t` family: NVIDIA's GR00T N1.5 (its released folder layout) as a flow policy.

- layout.py  torch-free: embodiment, metadata.json's min/max statistics, Eagle 2.5's prompt.
- model.py   Eagle 2.5 (SigLIP, Qwen3's first 12 layers) and the flow-matching DiT action head.
- folder.py  the released folder, read strictly; the published size.
- policy.py  the RL policy (π0's noise-injected chain, in GR00T's time direction).
"""
