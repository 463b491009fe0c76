"""rlvla3: fully asynchronous RL post-training of Vision-Language-Action policies.

Roles (one module each): simulator.py (CPU, numpy only), generator.py (inference),
trainer.py (PPO). run.py wires them over one MPI world; launch.py is the user entry point.
Nothing is imported here so a Simulator rank never pulls torch in by accident.
"""
