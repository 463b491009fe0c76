"""What users run besides a training job: demonstrations (collect), SFT, evaluation, the recipe
that chains them, and the benchmarks with their MPI workers (bench, bench_weights, megatron_check)."""
