"""Shipped models: each lives in models/<name>/ with a spec.json next to its ONNX file.

``load_spec("ctr")`` reads models/ctr/spec.json. The name is the directory, not the
model's own ``name`` field (which is e.g. "ctr_deepfm"). Every spec.json has, at least:

- ``name``, ``version``: the model's own, written into every result document;
- ``file``: the ONNX file's name, in the model's folder;
- ``inputs``, ``outputs``: lists of ``{"name", "dtype", "shape", ...}`` in feed order;
- ``ensure`` (optional): ``"module:function"`` that builds a missing ONNX file on
  demand (``function(path) -> path``; the text model is built from a weights package,
  not committed) and raises UserError when it cannot.

The rest (licence, source, preprocessing, hashing, ...) is the model's own
documentation, kept in ``raw``."""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import UserError

MODELS_DIR = Path(__file__).resolve().parent
# a plain directory name: no path separators, no leading dot
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str  # the model's own name from spec.json, e.g. "ctr_deepfm"
    version: str
    onnx_path: Path  # absolute
    inputs: list[dict[str, Any]]  # {"name", "dtype", "shape", ...} in feed order
    outputs: list[dict[str, Any]]
    raw: dict[str, Any]  # the whole spec.json
    # Where new versions come from (pipeline/registry/version_folders.py): the configured
    # file or version folder; None: onnx_path itself.
    source: Path | None = None


def shipped_models() -> list[str]:
    """Directory names under models/ that hold a spec.json, sorted."""
    return sorted(p.parent.name for p in MODELS_DIR.glob("*/spec.json"))


def load_spec(name: str) -> ModelSpec:
    """Read models/<name>/spec.json. Raises UserError (one line) for an unknown model,
    an unreadable spec or a missing ONNX file."""
    spec_path = MODELS_DIR / name / "spec.json"
    if not _NAME.match(name) or name.startswith(".") or not spec_path.is_file():
        shipped = ", ".join(shipped_models()) or "none"
        raise UserError(f"unknown model {name!r}; shipped models: {shipped}")
    return load_spec_file(spec_path)


def load_spec_file(spec_path: Path) -> ModelSpec:
    """Read a spec.json of this format wherever it is (a `pipelines:` entry's `model:`
    may name one, pipeline/registry/user_pipelines.py). Raises UserError (one line) for an
    unreadable spec or a missing ONNX file."""
    name = spec_path.parent.name
    try:
        raw = json.loads(spec_path.read_text())
        onnx_path = (spec_path.parent / raw["file"]).resolve()
        spec = ModelSpec(
            name=str(raw["name"]),
            version=str(raw["version"]),
            onnx_path=onnx_path,
            inputs=list(raw["inputs"]),
            outputs=list(raw["outputs"]),
            raw=raw,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc).splitlines()[0]
        raise UserError(f"model {name!r}: cannot read {spec_path}: {detail}") from None
    if not onnx_path.is_file() and raw.get("ensure"):
        module, _, function = str(raw["ensure"]).partition(":")
        getattr(importlib.import_module(module), function)(onnx_path)
    if not onnx_path.is_file():
        rebuild = f"python -m models.{name}.build" if spec_path.resolve().parent.parent == MODELS_DIR else "its build"
        raise UserError(f"model {name!r}: ONNX file {onnx_path} is missing; rebuild it with `{rebuild}`")
    return spec
