"""Every shipped model's spec.json has the one format models/registry.py reads (the
ONNX file named as "file", inputs and outputs as lists of named tensors), and every
pipeline loads its model through it. Before, the file was named three ways ("onnx": a
name, "file": a name, "onnx": {"file": a repo path}) and read by three loaders."""

from __future__ import annotations

import importlib
import json

import pytest

from models.registry import MODELS_DIR, ModelSpec, load_spec, shipped_models
from pipeline.registry.pipelines import get_pipeline, shipped_names


@pytest.mark.parametrize("name", shipped_models())
def test_every_spec_has_the_common_keys(name: str) -> None:
    raw = json.loads((MODELS_DIR / name / "spec.json").read_text())
    assert isinstance(raw["name"], str) and isinstance(raw["version"], str)
    assert isinstance(raw["file"], str) and "/" not in raw["file"] and raw["file"].endswith(".onnx")
    assert "onnx" not in raw, "the ONNX file is named by 'file' only"
    for key in ("inputs", "outputs"):
        assert isinstance(raw[key], list) and raw[key], key
        assert all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in raw[key]), key
    if "ensure" in raw:
        module, _, function = raw["ensure"].partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_the_shipped_models_are_ctr_camera_and_text() -> None:
    assert set(shipped_models()) >= {"ctr", "camera", "text"}


@pytest.mark.parametrize("name", ["ctr", "camera", "decoder"])
def test_committed_models_load_through_the_registry(name: str) -> None:
    spec = load_spec(name)
    assert isinstance(spec, ModelSpec) and spec.onnx_path.is_file()
    assert spec.onnx_path.parent == MODELS_DIR / name


def test_the_text_spec_names_the_file_its_build_writes() -> None:
    from models.text.build import default_model_path

    raw = json.loads((MODELS_DIR / "text" / "spec.json").read_text())
    assert raw["file"] == default_model_path().name
    assert raw["export"]["graph_version"] == int(default_model_path().stem.rsplit("-v", 1)[1])


@pytest.mark.parametrize("pipeline", shipped_names())
def test_every_pipeline_loads_its_model_through_the_registry(pipeline: str) -> None:
    spec = get_pipeline(pipeline).load_model()
    assert isinstance(spec, ModelSpec)
    assert spec.onnx_path.is_file()
    assert spec == load_spec(pipeline)  # its spec.json, read by models/registry.py
