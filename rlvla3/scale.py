"""`python -m rlvla3.scale`: the scaling test run by slurm/scale_test.sh (the code is rlvla3/cluster/scale.py)."""
import sys

from rlvla3.cluster.scale import main

if __name__ == "__main__":
    sys.exit(main())
