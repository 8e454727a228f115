"""`tensor-binary` (pipeline/codecs/tensor_binary.py): tensor-json's requests as msgpack
with raw tensor bytes. The same request in either form decodes to the same arrays and
bucket, so it gets the same result; bad input is refused with a reason naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.codecs.base import DecodeError
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.config import load_config
from pipeline.registry.pipelines import get_pipeline
from pipeline.runtime.onnx_graph import TensorInfo

msgpack = pytest.importorskip("msgpack")
from pipeline.codecs.tensor_binary import TensorBinaryCodec  # noqa: E402

INPUTS = [TensorInfo("dense", "tensor(float)", ("batch", 4)), TensorInfo("tokens", "tensor(int64)", ("batch", "seq")),
          TensorInfo("flag", "tensor(bool)", ("batch",)), TensorInfo("word", "tensor(string)", ("batch", 2))]
OUTPUTS = [TensorInfo("prob", "tensor(float)", ("batch", 1))]
DENSE = np.array([0.1, -2.5, 3.0, 1e-3], np.float32)
TOKENS = np.array([5, 7, 9], np.int64)


def json_form(**fields) -> bytes:
    doc = {"request_id": "r1", "dense": DENSE.tolist(), "tokens": TOKENS.tolist(), "flag": True, "word": ["a", "b"]}
    return json.dumps({**doc, **fields}).encode()


def binary_form(**fields) -> bytes:
    doc = {"request_id": "r1", "dense": DENSE.tobytes(), "tokens": {"shape": [3], "data": TOKENS.tobytes()},
           "flag": True, "word": ["a", "b"]}
    return msgpack.packb({**doc, **fields})


@pytest.fixture
def codecs() -> tuple[TensorJsonCodec, TensorBinaryCodec]:
    return TensorJsonCodec(INPUTS, OUTPUTS), TensorBinaryCodec(INPUTS, OUTPUTS)


@pytest.mark.parametrize("tokens", [TOKENS.tobytes(), {"shape": [3], "data": TOKENS.tobytes()}, [5, 7, 9]],
                         ids=["raw", "shaped", "array"])
def test_the_same_request_in_either_form_decodes_alike(codecs, tokens):
    text, binary = codecs
    a, b = text.decode(json_form(priority=3), None), binary.decode(binary_form(tokens=tokens, priority=3), None)
    assert (a.request_id, a.rows, a.priority, a.bucket) == (b.request_id, b.rows, b.priority, b.bucket)
    for name in a.payload:
        assert a.payload[name].dtype == b.payload[name].dtype and a.payload[name].tolist() == b.payload[name].tolist()
    feeds = binary.collate([b.payload, binary.decode(binary_form(), None).payload], pad_to_rows=4)
    assert feeds["dense"].shape == (4, 4) and feeds["tokens"].flags.writeable


def test_rows_many_takes_the_rows_from_the_length():
    c = TensorBinaryCodec(INPUTS[:1], OUTPUTS, rows="many")
    d = c.decode(msgpack.packb({"request_id": "r", "dense": np.zeros((3, 4), np.float32).tobytes()}), None)
    assert d.rows == 3 and d.payload["dense"].shape == (3, 4)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"dense": b"\0" * 10}, "dense: 10 bytes is not a whole number of float32 elements (4 bytes each)"),
    ({"dense": np.zeros(3, np.float32).tobytes()}, "dense: 3 elements do not fit shape [4]"),
    ({"dense": np.array([1, np.nan, 0, 0], np.float32).tobytes()}, "dense: not a finite number (NaN or infinity)"),
    ({"tokens": b""}, "tokens: 0 elements do not fit shape [seq]"),
    ({"tokens": {"shape": [2], "data": TOKENS.tobytes()}}, "tokens: shape [2] holds 2 elements, the data 3"),
    ({"tokens": {"shape": [3]}}, 'tokens: expected raw bytes, {"shape": [...], "data": <bytes>} or an array'),
    ({"tokens": {"shape": "3", "data": TOKENS.tobytes()}}, "tokens.shape: expected a list of sizes >= 0, got '3'"),
    ({"tokens": [1, 2.5]}, "tokens[1]: expected int, got float"),
    ({"flag": b"\x02"}, "flag: a bool element is not 0 or 1"),
    ({"word": b"ab"}, "word: a string input takes an array of strings, not bytes"),
    ({"dense": np.zeros(5, np.float32).tobytes()}, "dense: 5 elements do not fit shape [4]"),
    ({"request_id": 5}, "request_id: expected non-empty string, got int"),
])
def test_bad_binary_requests_name_the_field(codecs, fields, reason):
    with pytest.raises(DecodeError) as exc:
        codecs[1].decode(binary_form(**fields), None)
    assert str(exc.value) == reason


@pytest.mark.parametrize(("value", "reason"), [
    (b"", "empty message value"),
    (b"\x93\x01\x02\x03", "expected a msgpack map at top level, got array"),
    (b"\xc1", "malformed msgpack: "),
    (msgpack.packb({"request_id": "r"}) + b"\x00", "malformed msgpack: ExtraData"),
])
def test_what_is_not_a_msgpack_map_is_refused(codecs, value, reason):
    with pytest.raises(DecodeError) as exc:
        codecs[1].decode(value, None)
    assert str(exc.value).startswith(reason) and "\n" not in str(exc.value)


def test_raw_bytes_of_two_dynamic_dimensions_need_their_shape():
    c = TensorBinaryCodec(INPUTS[1:2], OUTPUTS, rows="many")
    with pytest.raises(DecodeError, match=r"^tokens: raw bytes of several dynamic dimensions \(rows, seq\) need"):
        c.decode(msgpack.packb({"request_id": "r", "tokens": TOKENS.tobytes()}), None)
    d = c.decode(msgpack.packb({"request_id": "r", "tokens": {"shape": [1, 3], "data": TOKENS.tobytes()}}), None)
    assert d.rows == 1 and d.payload["tokens"].tolist() == [[5, 7, 9]]


def test_an_entry_with_tensor_binary_warms_up_on_its_own_form(tmp_path):
    from tests.own_models import masked_encoder, ranker, run_alone

    pytest.importorskip("onnx")
    model = ranker(tmp_path / "ranker.onnx")
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"request_id": "s", "dense": [1, 2, 3, 4], "tokens": [1, 2]}\n')
    doc = {"pipeline": "bin", "pipelines": [{"name": "bin", "model": str(model), "codec": "tensor-binary"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    cfg = load_config(tmp_path / "c.yaml", environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    codec = spec.make_codec(cfg)
    assert isinstance(codec, TensorBinaryCodec)
    _key, value, _ = spec.make_samples(1)(0)
    d = codec.decode(value, None)  # generated samples are msgpack with raw tensors
    assert isinstance(msgpack.unpackb(value)["dense"], dict) and d.payload["tokens"].shape == (1, 8)
    from pipeline.runtime.session import InferenceSession
    from pipeline.scoring import ScoringStep

    step = ScoringStep(spec.load_model(), codec, InferenceSession(model, "cpu", 1))
    results, _ = step.infer([d])
    alone = run_alone(model, {k: np.array(v) for k, v in d.payload.items()})
    assert np.allclose(results[0]["prob"], alone["prob"][0], rtol=1e-6, atol=1e-7)
    doc["pipelines"][0]["samples"] = str(samples)  # JSON lines, sent in the binary form
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    cfg = load_config(tmp_path / "c.yaml", environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    assert spec.make_codec(cfg).decode(spec.make_samples(1)(0)[1], None).payload["tokens"].tolist() == [[1, 2]]
    # padding (tensor_pad.py) is the JSON form's, so it holds for this form too
    g = masked_encoder(Path(tmp_path / "masked.onnx"))
    from pipeline.runtime.onnx_graph import read_graph

    graph = read_graph(g)
    c = TensorBinaryCodec(graph.inputs, graph.outputs, pad={"dimension": "seq", "buckets": [4]})
    d = c.decode(msgpack.packb({"request_id": "r", "tokens": TOKENS.tobytes()}), None)
    assert d.payload["attention_mask"].tolist() == [[1, 1, 1, 0]]
