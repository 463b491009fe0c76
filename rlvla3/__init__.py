"""rlvla3: fully asynchronous RL post-training of Vision-Language-Action policies.

The wings, each importing only from the ones below it (ARCHITECTURE.md draws them):

    tools/     collect, sft, evaluate, recipe, bench: what users run besides a training job
    planner/   how to spend G GPUs: profile, models (analytic, DES), search, validation
    cluster/   where a run's ranks start: local mpiexec, Slurm het jobs, the scaling test
    engine/    the run itself: the three roles, their wiring and transport, shards, learners
    world.py   what a run derives from its config (ranks, roles, groups) and its checks
    envs/ policies/   simulator adapters and VLA families (neither imports the other)
    algo.py    the RL maths        config.py   the schema: every default

The top-level launch.py, bench.py, plan.py, collect.py, sft.py, evaluate.py, recipe.py and
scale.py are entry points only (`python -m rlvla3.<name>`). Nothing is imported here, so a
Simulator rank never pulls torch in by accident.
"""
