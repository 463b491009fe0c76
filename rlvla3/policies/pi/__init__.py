"""The π family: `pi0` and `pi05` (flow-matching action experts over PaliGemma).

- layout.py  torch-free: LeRobot's normaliser files and π0/π0.5's prompts (π0.5 writes the state
             into its prompt); the launcher and Simulators read it.
- pi0.py     `pi0` on transformers' PI0 classes, random-initialised or from a released folder.
- pi05.py    `pi05`: π0's model with the adaRMS time conditioning, LeRobot's π0.5 folder layout.
"""
