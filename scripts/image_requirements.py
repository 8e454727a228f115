"""Print the runtime requirements of pyproject.toml for a container image, one a
line, with the ONNX Runtime build of the image's flavour:

    python scripts/image_requirements.py cpu   # onnxruntime (CPU only, ~10x smaller)
    python scripts/image_requirements.py cuda  # onnxruntime-gpu (CUDA provider)

The Dockerfiles install these first (a layer that survives code edits), then the
project's own wheel with --no-deps. Both builds import as `onnxruntime`; the version
range is pyproject's. Standard library only: it runs before anything is installed."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

GPU = "onnxruntime-gpu"
CPU = "onnxruntime"


def requirements(flavour: str, pyproject: Path = Path("pyproject.toml")) -> list[str]:
    if flavour not in ("cpu", "cuda"):
        raise SystemExit(f"flavour must be cpu or cuda, not {flavour!r}")
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        name = re.split(r"[\s<>=!~;\[]", dep, maxsplit=1)[0].lower().replace("_", "-")
        if name in (GPU, CPU):
            spec = dep[len(name):]
            dep = (CPU if flavour == "cpu" else GPU) + spec
        out.append(dep)
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1] if len(sys.argv) > 1 else "cpu")))
