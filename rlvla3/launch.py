"""`python -m rlvla3.launch`: compose, validate and start a run, locally or as a Slurm het job (the code is rlvla3/cluster/launch.py)."""
import sys

from rlvla3.cluster.launch import main

if __name__ == "__main__":
    sys.exit(main())
