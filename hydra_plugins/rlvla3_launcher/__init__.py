"""Hydra launcher plugin of rlvla3: `-m` sweeps as one Slurm heterogeneous job per point."""
