"""A configuration file with one pipeline defined in it (`pipelines:`), for the tests of
tests/unit/own_model/."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_config(tmp_path: Path, **entry) -> Path:
    doc = {"pipeline": "mine", "pipelines": [{"name": "mine", "model": "m.onnx", **entry}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
