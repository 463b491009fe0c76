"""Where a run's ranks start: the launcher (launch.py, compose.py), local mpiexec (local.py), Slurm
heterogeneous jobs through submitit (slurm.py) and the scaling test (scale.py)."""
