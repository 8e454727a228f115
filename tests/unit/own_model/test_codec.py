"""Issue 20, "Your own model": the tensor-json codec on models built here with
onnx.helper (tests/own_models.py): results equal the model run alone, buckets, bad
requests named by field, output mappings, models refused at start. Fast: no Kafka."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.codecs.base import DecodeError
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.runtime.onnx_graph import read_graph
from tests.own_models import fixed_batch, run_alone

pytest.importorskip("onnx")

def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def req(**fields) -> bytes:
    return json.dumps({"request_id": "r1", "features": [0.1, 0.2, 0.3, 0.4], "tokens": [1, 2, 3], **fields}).encode()


def test_results_equal_the_model_on_each_request_alone(model, codec):
    bodies = [req(request_id=f"r{i}", tokens=[i, i + 1, 9 - i], features=[i / 3, -1.5, 2, 0]) for i in range(5)]
    decoded = [codec.decode(b, None) for b in bodies]
    assert len({d.bucket for d in decoded}) == 1
    g = read_graph(model)
    from pipeline.runtime.session import InferenceSession

    session = InferenceSession(g.path, "cpu", 1)
    results = codec.split(session.run(codec.collate([d.payload for d in decoded], pad_to_rows=8)), decoded)
    for body, result in zip(bodies, results, strict=True):
        doc = json.loads(body)
        alone = run_alone(model, {"dense": np.array([doc["features"]], np.float32),
                                  "tokens": np.array([doc["tokens"]], np.int64)})
        assert set(result) == {"score"}
        assert np.allclose(result["score"], alone["prob"][0], rtol=1e-6, atol=1e-7)


def test_sequence_lengths_are_separate_buckets(codec):
    a, b = codec.decode(req(tokens=[1, 2]), None), codec.decode(req(tokens=[1, 2, 3]), None)
    assert a.bucket != b.bucket


@pytest.mark.parametrize(("fields", "reason"), [
    ({"features": None}, "features: expected int or float, got null"),
    ({"features": [0.1, "x", 0.3, 0.4]}, "features[1]: expected int or float, got string"),
    ({"features": [0.1, 0.2, 0.3]}, "features: dimension 1 must have size 4, got 3"),
    ({"features": [[0.1, 0.2, 0.3, 0.4]]}, "features: expected 1 dimension(s) [4], got shape [1, 4]"),
    ({"features": [True, False, True, False]}, "features[0]: expected int or float, got bool"),
    ({"features": [1e39, 0, 0, 0]}, "features: number out of range for float32"),
    ({"tokens": [1, 2.5]}, "tokens[1]: expected int, got float"),
    ({"tokens": [[1, 2], [3]]}, "tokens: ragged array (rows of different lengths)"),
    ({"tokens": []}, "tokens: dimension 'seq' is empty"),
    ({"tokens": 7}, "tokens: expected 1 dimension(s) [seq], got shape []"),
    ({"tokens": [2**63]}, "tokens: value out of range for int64 (-9223372036854775808..9223372036854775807)"),
    ({"request_id": 5}, "request_id: expected non-empty string, got int"),
    ({"tokens": _nested(70)}, "tokens: nested deeper than 32 levels"),
    ({"features": {"a": 1}}, "features: expected int or float, got object"),
])
def test_bad_requests_name_the_field(codec, fields, reason):
    with pytest.raises(DecodeError) as exc:
        codec.decode(req(**fields), None)
    assert str(exc.value) == reason


def test_missing_field_and_malformed_json(codec):
    with pytest.raises(DecodeError, match="^missing field 'tokens'$"):
        codec.decode(b'{"request_id": "r", "features": [1, 2, 3, 4]}', None)
    with pytest.raises(DecodeError, match="^malformed JSON"):
        codec.decode(b'{"request_id": ', None)


def test_named_dimension_must_agree_between_fields(model):
    g = read_graph(model)
    c = TensorJsonCodec(g.inputs, g.outputs)
    c.fields[0] = type(c.fields[0])("dense", "dense", np.dtype(np.float32), ("seq",))  # both fields share 'seq'
    with pytest.raises(DecodeError, match="^tokens: dimension 'seq' has size 2, but 4 in field 'dense'$"):
        c.decode(b'{"request_id": "r", "dense": [1, 2, 3, 4], "tokens": [1, 2]}', None)


def test_rows_many_splits_per_row(model):
    g = read_graph(model)
    c = TensorJsonCodec(g.inputs, g.outputs, rows="many", max_rows=3)
    d = c.decode(b'{"request_id": "r", "dense": [[1, 2, 3, 4], [0, 0, 0, 0]], "tokens": [[1], [2]]}', None)
    assert d.rows == 2
    out = c.split({"prob": np.ones((2, 1)), "hidden": np.zeros((2, 3))}, [d])[0]
    assert out == {"prob": [[1.0], [1.0]], "hidden": [[0.0] * 3] * 2}
    with pytest.raises(DecodeError, match="^tokens: 1 rows, but 2 in field 'dense'$"):
        c.decode(b'{"request_id": "r", "dense": [[1, 2, 3, 4], [0, 0, 0, 0]], "tokens": [[1]]}', None)
    with pytest.raises(DecodeError, match=r"^dense: expected 1\.\.3 rows, got 4$"):
        c.decode(json.dumps({"request_id": "r", "dense": [[1, 2, 3, 4]] * 4, "tokens": [[1]] * 4}).encode(), None)


def test_zipmap_output_becomes_objects_with_string_keys(codec):
    d = codec.decode(req(), None)
    c = TensorJsonCodec.__new__(TensorJsonCodec)
    c.results, c.many, c.out_dims, c.pad = {"probabilities": "zipmap"}, False, {}, None
    assert c.split({"zipmap": [{0: np.float32(0.25), 1: np.float32(0.75)}]}, [d]) == [
        {"probabilities": {"0": 0.25, "1": 0.75}}]


@pytest.mark.parametrize(("fields", "results", "reason"), [
    ({"f": "nope", "tokens": "tokens"}, None, "inputs.f: the model has no input 'nope'; its inputs: dense, tokens"),
    ({"features": "dense"}, None, "inputs: model input(s) tokens have no request field"),
    ({"request_id": "dense", "tokens": "tokens"}, None, "inputs.request_id: 'request_id' is a reserved request field"),
    (None, {"p": "nope"}, "outputs.p: the model has no output 'nope'; its outputs: prob, hidden"),
])
def test_mapping_that_does_not_fit_the_model(model, fields, results, reason):
    g = read_graph(model)
    with pytest.raises(ValueError) as exc:
        TensorJsonCodec(g.inputs, g.outputs, fields, results)
    assert str(exc.value) == reason


def test_scalar_output_is_refused_at_start():
    from pipeline.runtime.onnx_graph import TensorInfo

    inputs = [TensorInfo("x", "tensor(float)", ("N", 2))]
    outputs = [TensorInfo("y", "tensor(float)", ("N",)), TensorInfo("total", "tensor(float)", ())]
    with pytest.raises(ValueError, match="^outputs.total: output 'total' is a scalar, not one row per request$"):
        TensorJsonCodec(inputs, outputs)
    assert TensorJsonCodec(inputs, outputs, results={"y": "y"}).results == {"y": "y"}


def test_fixed_batch_model_is_refused_with_the_way_out(tmp_path):
    g = read_graph(fixed_batch(tmp_path / "fixed.onnx"))
    with pytest.raises(ValueError, match="no dynamic batch dimension .*tidebatch inspect"):
        TensorJsonCodec(g.inputs, g.outputs)
