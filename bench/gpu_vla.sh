#!/usr/bin/env bash
# The policy-family GPU check: one prepared command for an offline machine with an NVIDIA GPU.
#   stage 1  install the carried wheels (SET=vla bash bench/gpu_wheels.sh 3.12 .whl-vla, here)
#   stage 2  python -m rlvla3.bench families on the GPU: act and train-step time per family at
#            batch 1/8/32 (tiny, openvla parallel/autoregressive/OFT chunks, pi0)
#   stage 3  python -m rlvla3.tools.megatron_check --gpu: the Llama LM at TP = PP = 1 with Megatron's DDP
#            and optimizer vs transformers + torch Adam (same logits, same weights after 3 steps)
#   stage 4  python -m rlvla3.bench families --size published: openvla, openvla_oft, pi0, pi05, smolvla, gr00t at their
#            released sizes as the LIBERO presets set them up (random weights, LoRA 32 or full as each preset sets it,
#            FSDP2 on one rank in bf16), act and FSDP train-step time at batch 1/8/32 with peak GPU
#            memory; and bench memory's meta-device prediction of the same configurations beside it
# Files land in $OUT (default bench-out/) after each stage. Budget: under 8 minutes.
#
#   SET=vla bash bench/gpu_wheels.sh 3.12 .whl-vla                   # here, online (~40 MiB)
#   device run: command "WHL=.whl-vla bash bench/gpu_vla.sh", carry [".whl-vla"]
#   RLVLA3_GPU_BENCH_REHEARSAL=1 bash bench/gpu_vla.sh               # rehearse on CPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench-out}
WHL=${WHL:-.whl-vla}
SITE=${SITE:-/tmp/rlvla3-vla-site}
REHEARSAL=${RLVLA3_GPU_BENCH_REHEARSAL:-0}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOG="$OUT/vla-log.txt"
: > "$LOG"
TAG=gpu-vla
. bench/stages.sh

if ls "$WHL"/*.whl >/dev/null 2>&1; then
  stage install 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
    || { say "wheel install failed"; exit 1; }
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  say "no wheels under $WHL: using what is installed"
fi
stage check 60 $PY -c "import torch, transformers, megatron.core, hydra; print('imports ok; torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  || { say "imports failed: see $LOG"; exit 1; }

if [ "$REHEARSAL" = 1 ]; then
  stage families 300 $PY -m rlvla3.bench families --families tiny,pi0_chunk4 --batches 1,8 --repeats 2 --out "$OUT"
  stage fsdp 120 $PY -m rlvla3.bench families --families pi05_chunk4 --batches 1 --repeats 2 policy.data_parallel=fsdp policy.compute_dtype=bfloat16
  stage memory 300 $PY -m rlvla3.bench memory --families openvla_oft --out "$OUT"
else
  stage families 150 $PY -m rlvla3.bench families --out "$OUT" policy.device=cuda
  stage megatron 90 bash -c "$PY -m rlvla3.tools.megatron_check --gpu | tail -1 > '$OUT/megatron_gpu.json'"
  stage published 240 $PY -m rlvla3.bench families --size published --batches 1,8,32 --repeats 3 --out "$OUT"
  stage memory 200 $PY -m rlvla3.bench memory --out "$OUT"
fi
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
