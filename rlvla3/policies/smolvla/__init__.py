"""The `smolvla` family: SmolVLA (LeRobot's smolvla_base layout) as a flow policy.

- layout.py  torch-free: its prompt (SmolVLM2's tokenizer, the task and a newline).
- model.py   the architecture on transformers' SmolVLM and Llama modules.
- folder.py  LeRobot's folder: config.json + model.safetensors, read strictly; the published size.
- policy.py  the RL policy (π0's noise-injected chain over SmolVLA's flow).
"""
