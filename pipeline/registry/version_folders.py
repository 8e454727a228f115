"""Where a pipeline's model versions live, and which one is newest.

A pipeline's `model:` (pipeline/registry/user_pipelines.py) or a shipped model's ONNX file
(models/registry.py) is either

- a file: one version. It is the version the configuration names (default "1") as
  it is at start; a changed file is a new version named `<version>+<sha256[:8]>` of
  its new content, so two different models never share a `model_version`;
- a folder of version folders, as in Triton's model repository: `<dir>/<N>/model.onnx`
  with N a positive integer. The highest N is served; a folder name that is not a
  number is ignored (a version being copied can be staged as `3.tmp` and renamed).

A scan only stats files (name, size, mtime): cheap enough to run every few seconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

from models.registry import ModelSpec

MODEL_FILE = "model.onnx"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One version found by a scan. `fingerprint` changes when its file does."""

    version: str | None  # the folder's number; None for a plain file (named when loaded)
    path: Path
    fingerprint: tuple[int, int]  # (size, mtime_ns)

    @property
    def order(self) -> int:
        return int(self.version) if self.version is not None else 0


def is_repository(path: Path) -> bool:
    return path.is_dir()


def scan(path: Path) -> list[Candidate]:
    """The versions under `path`, oldest first ([] when there are none)."""
    if not path.is_dir():
        stat = _stat(path)
        return [] if stat is None else [Candidate(None, path, stat)]
    found: list[Candidate] = []
    for child in _numbered(path):
        stat = _stat(child / MODEL_FILE)
        if stat is not None:
            found.append(Candidate(str(int(child.name)), child / MODEL_FILE, stat))
    return sorted(found, key=lambda c: c.order)


def without_model(path: Path) -> list[Path]:
    """The version folders under `path` (numbered) that hold no model.onnx: not
    versions, which a scan skips; the worker says so once (pipeline/versions/manager.py)."""
    if not path.is_dir():
        return []
    return sorted((c for c in _numbered(path) if _stat(c / MODEL_FILE) is None), key=lambda c: int(c.name))


def _numbered(path: Path) -> list[Path]:
    return [c for c in path.iterdir() if c.name.isdigit() and int(c.name) > 0]


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns) if path.is_file() else None


def file_version(base_version: str, path: Path) -> str:
    """The name of a changed plain file's new version."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return f"{base_version}+{digest.hexdigest()[:8]}"


def spec_for(serving: ModelSpec, candidate: Candidate, base_version: str) -> ModelSpec:
    """The ModelSpec of a candidate: the serving one's name and declared inputs and
    outputs, the candidate's file and version."""
    version = candidate.version or file_version(base_version, candidate.path)
    return dataclasses.replace(serving, version=version, onnx_path=candidate.path.resolve())
