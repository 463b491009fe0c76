"""The benchmarks behind `python -m rlvla3.bench <what>`: one module per benchmark (`<what>.py`,
whose `run(args)` prints its table and saves its rows), the command line in cli.py, what several
share in common.py, and the meta-device memory model `memory` reads in footprint.py."""
