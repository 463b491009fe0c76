#!/usr/bin/env bash
# ManiSkill3's own virtual environment, .venv-maniskill/, and the Vulkan driver SAPIEN renders with,
# .mesa-backports/, both at the repository root (env=maniskill runs its env processes under
# .venv-maniskill/bin/python; see rlvla3/envs/maniskill_env.py).
#
# SAPIEN renders through Vulkan even for state observations. Without a GPU that is Mesa's lavapipe,
# and Debian 12's Mesa 22.3.6 lacks VK_KHR_external_semaphore_fd (Mesa >= 24.3 has it). Mesa 25
# from bookworm-backports works: its Vulkan driver (and the newer libdrm it needs) is downloaded
# with a private apt configuration and unpacked into .mesa-backports/ -- nothing of the system's
# Mesa (the GL stack the MuJoCo envs render with) is replaced. The Vulkan loader and the X/Wayland
# client libraries the driver links come from Debian 12 itself. mani-skill is installed beside
# the CPU build of torch (a plain install pulls a multi-GB CUDA one). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-maniskill
MESA=.mesa-backports
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python
MESA_VERSION=25.0.7-2~bpo12+1

need_apt=()
for p in libvulkan1 libllvm15 libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-sync1 libxcb-xfixes0 libxcb-shm0 \
         libxshmfence1 libwayland-client0 libx11-xcb1 libelf1; do
  dpkg -s "$p" >/dev/null 2>&1 || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=900 "${need_apt[@]}"
fi

if [ ! -f "$MESA/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so" ]; then
  work=$(mktemp -d)
  mkdir -p "$work/lists/partial" "$work/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main" \
    > "$work/sources.list"
  apt_private=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/nonexistent
               -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o APT::Sandbox::User=root)
  apt-get "${apt_private[@]}" update -qq
  (cd "$work" && apt-get "${apt_private[@]}" download -qq "mesa-vulkan-drivers=$MESA_VERSION" \
      libdrm2/bookworm-backports libdrm-amdgpu1/bookworm-backports)
  rm -rf "$MESA" && mkdir -p "$MESA"
  for deb in "$work"/*.deb; do dpkg -x "$deb" "$MESA"; done
  rm -rf "$work"
fi
# The driver's manifest names the library by absolute path: this checkout's.
lvp="$(pwd)/$MESA/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so"
sed -i "s#\"library_path\": \"[^\"]*\"#\"library_path\": \"$lvp\"#" "$MESA/usr/share/vulkan/icd.d/lvp_icd.json"

if ! "$VENV/bin/python" -c "import mani_skill.envs" 2>/dev/null; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "torch==2.13.0" "mani-skill==3.0.1" "sapien==3.0.3"
fi
# A real PickCube step, rendered, through the adapter the Simulator's env processes use.
PYTHONPATH="$(pwd)" "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
from types import SimpleNamespace

from rlvla3.envs.maniskill_env import ManiSkillEnv

env = ManiSkillEnv(SimpleNamespace(task="PickCube-v1", image_size=32, cameras=["base_camera"], instruction=""))
obs = env.reset(0)
obs, *_ = env.step([0.0] * 7)
assert obs.images.shape == (1, 32, 32, 3) and obs.images.max() > 0, obs.images.shape
env.close()
print("maniskill setup ok:", {p: md.version(p) for p in ("mani-skill", "sapien", "torch", "numpy")}, "PickCube-v1 renders")
PY
