"""Build a trimmed robosuite wheel: all of its code, only the assets the bench's task loads.

robosuite's wheel is ~150 MB, nearly all meshes and textures of robots and objects the GPU
benchmark never loads; the device machine takes at most ~40 MiB of carried wheels. This script
builds the bench's env here (rlvla3.envs.robosuite_env, Lift + Panda by default), records every
file under robosuite/ it opens (Python's audit hook: the XMLs) and every file the compiled
MuJoCo model names (meshes, textures), and writes `robosuite-<version>+trim-py3-none-any.whl`
with every non-asset file plus those assets.

    python bench/trim_robosuite.py --out .whl [--task Lift] [--robot Panda]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import sys
import zipfile
from pathlib import Path

ASSETS = Path("models") / "assets"


def used_assets(task: str, robot: str) -> set[Path]:
    import robosuite

    from rlvla3 import config
    from rlvla3.envs.robosuite_env import RobosuiteEnv

    root = Path(robosuite.__file__).resolve().parent
    opened: set[Path] = set()

    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            p = Path(os.fspath(args[0])).resolve()
            if root in p.parents:
                opened.add(p)

    sys.addaudithook(hook)
    env_cfg = config.EnvConfig(name="robosuite", task=task, robot=robot)
    env = RobosuiteEnv(env_cfg)
    env.reset(0)
    env.step(__import__("numpy").zeros(7))
    xml = env.env.sim.model.get_xml()
    env.close()
    named = {Path(m).resolve() for m in re.findall(r'file="([^"]+)"', xml)}
    return {p.relative_to(root) for p in opened | named if p.is_file() and root in p.parents}


def build(out: Path, task: str, robot: str) -> Path:
    from importlib.metadata import distribution

    import robosuite

    root = Path(robosuite.__file__).resolve().parent
    keep_assets = {p for p in used_assets(task, robot) if ASSETS in p.parents}
    dist = distribution("robosuite")
    version = dist.version
    name = f"robosuite-{version}+trim-py3-none-any.whl"
    out.mkdir(parents=True, exist_ok=True)
    record = []
    with zipfile.ZipFile(out / name, "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc: str, data: bytes) -> None:
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")

        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or "__pycache__" in rel.parts:
                continue
            if ASSETS in rel.parents and rel not in keep_assets:
                continue
            add(f"robosuite/{rel.as_posix()}", path.read_bytes())
        info = f"robosuite-{version}+trim.dist-info"
        meta = dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: robosuite\nVersion: {version}\n"
        meta = re.sub(r"^Version: .*$", f"Version: {version}+trim", meta, count=1, flags=re.M)
        add(f"{info}/METADATA", meta.encode())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: rlvla3 bench/trim_robosuite.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    print(f"{out / name}: {(out / name).stat().st_size / 2**20:.1f} MiB, {len(keep_assets)} assets kept for {task}/{robot}")
    return out / name


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(".whl"))
    ap.add_argument("--task", default="Lift")
    ap.add_argument("--robot", default="Panda")
    a = ap.parse_args()
    build(a.out, a.task, a.robot)
