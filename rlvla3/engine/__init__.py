"""The engine: one run's ranks and what they exchange.

The roles (simulator.py, generator.py, trainer.py with its learners) over the edge list
(wiring.py) and its transport (transport.py: MPI, or in-process for tests in inprocess.py), the
messages (protocol.py), the dynamic batcher, shards, weights, checkpoints and metrics; run.py is
each rank's main. Imports neither cluster/, planner/ nor tools/, and nothing heavy here:
spawned env children re-import the main module's package.
"""
