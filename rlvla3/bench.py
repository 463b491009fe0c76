"""`python -m rlvla3.bench <what>`: the benchmarks (throughput ladder, weight sync, policy families,
memory, simulators, faults, shards, latency, observations); each is a module of rlvla3/benchmarks/."""
import sys

from rlvla3.benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
