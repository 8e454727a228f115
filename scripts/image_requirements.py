"""Print the runtime requirements of pyproject.toml for a container image, one a
line: the base dependencies, the ONNX Runtime build of the image's flavour and the
extras the image is built with (Dockerfile's ARG EXTRAS):

    python scripts/image_requirements.py cpu otel,s3    # + onnxruntime (the `cpu` extra)
    python scripts/image_requirements.py cuda otel,s3   # + onnxruntime-gpu (the `gpu` extra)

The Dockerfiles install these first (a layer that survives code edits), then the
project's own wheel with --no-deps. The flavour picks `cpu` or `gpu`, never both (they
install the same `onnxruntime` module; pipeline/extras.py). Standard library only: it
runs before anything is installed."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ORT_EXTRA = {"cpu": "cpu", "cuda": "gpu"}


def requirements(flavour: str, extras: str = "", pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """`extras`: comma-separated names of pyproject's optional-dependencies ("" for none)."""
    if flavour not in ORT_EXTRA:
        raise SystemExit(f"flavour must be cpu or cuda, not {flavour!r}")
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project["optional-dependencies"]
    names = [ORT_EXTRA[flavour], *(e.strip() for e in extras.split(",") if e.strip())]
    for name in names[1:]:
        if name in ORT_EXTRA.values():
            raise SystemExit(f"extra {name!r}: the flavour ({flavour}) picks the ONNX Runtime build")
        if name not in optional:
            raise SystemExit(f"no extra {name!r} in {pyproject}: use {', '.join(sorted(optional))}")
    out = list(project["dependencies"])
    for name in names:
        out += [req for req in optional[name] if req not in out]
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print("\n".join(requirements(args[0] if args else "cpu", args[1] if len(args) > 1 else "")))
