#!/usr/bin/env bash
# Install everything rlvla3 needs on a fresh Debian 12 machine with Python 3.11 (run as root).
# Idempotent: skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# LIBERO's own interpreter (.venv-libero, env=libero): mostly downloads, so it runs beside the rest.
libero_log=$(mktemp)
bash scripts/setup_libero.sh >"$libero_log" 2>&1 &
libero_pid=$!
wait_libero() {
  if ! wait "$libero_pid"; then cat "$libero_log"; echo "scripts/setup_libero.sh failed" >&2; exit 1; fi
  cat "$libero_log"
}
# ManiSkill3's interpreter (.venv-maniskill) and Mesa's lavapipe from bookworm-backports
# (.mesa-backports, env=maniskill): after the apt step below, whose lock it would otherwise wait on.

need_apt=()
command -v mpiexec >/dev/null || need_apt+=(openmpi-bin libopenmpi-dev)
dpkg -s libegl1 >/dev/null 2>&1 || need_apt+=(libegl1 libgl1 libegl-mesa0)   # headless MuJoCo (EGL)
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=900 "${need_apt[@]}"
fi

maniskill_log=$(mktemp)
bash scripts/setup_maniskill.sh >"$maniskill_log" 2>&1 &
maniskill_pid=$!

# Every version as requirements.lock pins it (scripts/lock.sh writes it): the same set on every machine.
lock=(-c requirements.lock)
python -m pip install -q "${lock[@]}" "torch==2.13.0"   # the CPU build; a plain `torch` pulls CUDA
python -m pip install -q "${lock[@]}" -e ".[sim,test,analysis,vla,megatron,wandb,docs]" "hydra-core==1.3.8" "omegaconf==2.3.*" "mujoco==3.3.7"
python -m pip install -q "${lock[@]}" --no-deps "robosuite==1.5.2"  # its mink pin would force numpy<2 (zarr 3 needs >=2)
python -m pip install -q "${lock[@]}" --no-deps "metaworld==3.1.1"  # its mujoco==3.3.0 pin is stricter than needed (3.3.7 works)
python - <<'PY'
import numpy, zarr, torch, mpi4py, robosuite, metaworld, transformers, megatron.core  # noqa: F401  (fail here, not in a test)
assert int(numpy.__version__.split(".")[0]) >= 2, numpy.__version__
print("rlvla3 setup ok: torch", torch.__version__, "numpy", numpy.__version__, "zarr", zarr.__version__)
PY
wait_libero
if ! wait "$maniskill_pid"; then cat "$maniskill_log"; echo "scripts/setup_maniskill.sh failed" >&2; exit 1; fi
tail -1 "$maniskill_log"
