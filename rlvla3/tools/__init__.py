"""What users run besides a training job: demonstrations (collect), SFT, evaluation, the recipe
that chains them, LeRobot datasets, LIBERO's protocol and port check, and the Megatron path's MPI
check (megatron_check). The benchmarks are their own package (rlvla3/benchmarks/)."""
