"""Fixtures of tests/unit/own_model/: the ranker built with onnx.helper
(tests/own_models.py) and a tensor-json codec on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.runtime.onnx_graph import read_graph
from tests.own_models import ranker


@pytest.fixture(scope="package")
def model(tmp_path_factory) -> Path:
    return ranker(tmp_path_factory.mktemp("own") / "ranker.onnx")


@pytest.fixture(scope="package")
def codec(model) -> TensorJsonCodec:
    g = read_graph(model)
    return TensorJsonCodec(g.inputs, g.outputs, {"features": "dense", "tokens": "tokens"}, {"score": "prob"})
