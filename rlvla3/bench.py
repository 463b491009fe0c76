"""`python -m rlvla3.bench`: benchmarks: throughput ladder, weight sync, policy families, simulators (the code is rlvla3/tools/bench.py)."""
import sys

from rlvla3.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
