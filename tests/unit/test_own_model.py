"""Issue 20, "Your own model": `tidebatch inspect`, the tensor-json codec and pipelines
defined in the configuration, on models built here with onnx.helper (tests/own_models.py).
Fast: no Kafka."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.cli import main
from pipeline.codecs.base import DecodeError
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.registry.pipelines import get_pipeline
from pipeline.runtime.onnx_graph import read_graph, read_header
from tests.own_models import fixed_batch, ranker, run_alone

pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return ranker(tmp_path_factory.mktemp("own") / "ranker.onnx")


@pytest.fixture(scope="module")
def codec(model) -> TensorJsonCodec:
    g = read_graph(model)
    return TensorJsonCodec(g.inputs, g.outputs, {"features": "dense", "tokens": "tokens"}, {"score": "prob"})


def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def req(**fields) -> bytes:
    return json.dumps({"request_id": "r1", "features": [0.1, 0.2, 0.3, 0.4], "tokens": [1, 2, 3], **fields}).encode()


# ----------------------------------------------------------------------------- graph
def test_read_graph_names_dynamic_dims(model):
    g = read_graph(model)
    assert [(t.name, t.type, t.shape) for t in g.inputs] == [
        ("dense", "tensor(float)", ("batch", 4)), ("tokens", "tensor(int64)", ("batch", "seq"))]
    assert [t.name for t in g.outputs] == ["prob", "hidden"]
    assert (g.ir_version, g.opsets, g.producer) == (10, {"": 13}, "tidebatch-test")


@pytest.mark.parametrize("data", [b"", b"garbage\n", b"\x08\x0a"])
def test_read_header_refuses_what_is_not_a_model(data):
    with pytest.raises(ValueError):
        read_header(data)


@pytest.mark.parametrize("content", [None, b"not a model at all", "truncated"])
def test_missing_or_corrupt_file_is_one_line(model, tmp_path, capsys, content):
    path = tmp_path / "m.onnx"
    if content == "truncated":
        path.write_bytes(model.read_bytes()[:200])
    elif content is not None:
        path.write_bytes(content)
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tidebatch: error: ") and "m.onnx" in err


def test_ir_version_too_new_names_the_fix(model, tmp_path):
    import onnx

    proto = onnx.load(str(model))
    proto.ir_version = 99  # newer than any ONNX Runtime reads (1.32 reads 14, which 1.31 refuses)
    onnx.save(proto, str(tmp_path / "new.onnx"))
    with pytest.raises(UserError, match=r"IR version 99 is newer than it reads \(1[34]\): set model.ir_version = 10"):
        read_graph(tmp_path / "new.onnx")


# ----------------------------------------------------------------------------- inspect
def test_inspect_report_sample_and_config_work(model, tmp_path, capsys):
    assert main(["inspect", str(model)]) == 0
    out = capsys.readouterr().out
    assert "dense   tensor(float)      [batch, 4]" in out and "tokens  tensor(int64)      [batch, seq]" in out
    assert "IR version 10; opsets ai.onnx 13" in out and "batching    yes" in out and "seq:" in out
    sample = out.split("left out):\n", 1)[1].split("\n", 1)[0]
    config_text = out.split("ranker.yaml`):\n", 1)[1]
    (tmp_path / "ranker.yaml").write_text(config_text)
    cfg = load_config(tmp_path / "ranker.yaml", environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    d = spec.make_codec(cfg).decode(sample.encode(), None)  # the sample is a valid request
    assert d.rows == 1 and d.payload["tokens"].shape == (1, 3)


def test_inspect_fixed_batch_reports_the_fix_and_it_works(tmp_path, capsys):
    import subprocess
    import sys

    fixed_batch(tmp_path / "fixed.onnx")
    assert main(["inspect", str(tmp_path / "fixed.onnx")]) == 0
    out = capsys.readouterr().out
    assert "batching    NO: input 'x' has a fixed batch dimension of 1" in out
    command = out.split("make dimension 0 dynamic:\n", 1)[1].split("\n", 1)[0].strip()
    assert command.startswith('python -c "')
    subprocess.run([sys.executable, "-c", command[len('python -c "'):-1]], cwd=tmp_path, check=True)
    assert read_graph(tmp_path / "fixed_batch.onnx").inputs[0].shape == ("batch", 4)


# ----------------------------------------------------------------------------- codec
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


# ----------------------------------------------------------------------------- config
def _config(tmp_path: Path, **entry) -> Path:
    doc = {"pipeline": "mine", "pipelines": [{"name": "mine", "model": "m.onnx", **entry}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(("entry", "reason"), [
    ({"codec": "msgpack"}, "config key 'pipelines[0].codec': 'msgpack' is not one of tensor-json"),
    ({"rows": "some"}, "config key 'pipelines[0].rows': 'some' is not one of one, many"),
    ({"max_batch_rows": 0}, "config key 'pipelines[0].max_batch_rows': must be >= 1"),
    ({"inputs": {"a": 3}}, "config key 'pipelines[0].inputs.a': expected str, got 3"),
    ({"modle": "x"}, "config key 'pipelines[0].modle': is not known"),
    ({"name": "ctr"}, "config key 'pipelines[0].name': 'ctr' is a shipped pipeline"),
    ({"name": "a b"}, "config key 'pipelines[0].name': 'a b' must be letters"),
])
def test_config_errors_name_the_key(tmp_path, entry, reason):
    with pytest.raises(UserError) as exc:
        load_config(_config(tmp_path, **entry), environ={})
    assert str(exc.value).startswith(reason)


def test_unknown_pipeline_lists_the_defined_ones(tmp_path):
    with pytest.raises(UserError, match="unknown pipeline 'other'.*defined under pipelines: mine"):
        load_config(_config(tmp_path), {"pipeline": "other"}, environ={})


def test_defined_pipeline_is_a_pipeline_spec(model, tmp_path):
    cfg = load_config(_config(tmp_path, model=str(model), version=3, max_batch_rows=64,
                              outputs={"score": "prob"}, sample_dims={"seq": 5}), environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    assert (spec.name, spec.input_topic, spec.output_topic, spec.max_batch_rows) == (
        "mine", "mine.requests", "mine.results", 64)
    m = spec.load_model()
    assert (m.name, m.version, m.onnx_path) == ("mine", "3", model.resolve())
    codec = spec.make_codec(cfg)
    key, value, headers = spec.make_samples(1)(0)
    d = codec.decode(value, dict(headers))
    assert key == b"mine-1-0" and d.payload["tokens"].shape == (1, 5)


def test_model_file_missing_is_one_line_at_start(tmp_path):
    cfg = load_config(_config(tmp_path, model=str(tmp_path / "absent.onnx")), environ={})
    with pytest.raises(UserError, match="model file not found: .*absent.onnx"):
        get_pipeline(cfg.pipeline, cfg.pipelines).load_model()


def test_model_process_carries_a_zipmap_and_refuses_a_sequence_of_tensors_at_start(tmp_path):
    from tests.own_models import odd_outputs, tree_classifier

    on = {"runtime": {"model_process": True}}
    cfg = load_config(_config(tmp_path, model=str(tree_classifier(tmp_path / "trees.onnx"))), on, environ={})
    assert get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg).results == {
        "label": "label", "probabilities": "probabilities"}  # pipeline/runtime/wire_values.py carries it
    path = _config(tmp_path, model=str(odd_outputs(tmp_path / "odd.onnx")), outputs={"y": "y"})
    cfg = load_config(path, on, environ={})
    with pytest.raises(UserError, match="^pipeline 'mine': 'parts' is a seq\\(tensor\\(float\\)\\), which runtime.model_process "
                       "cannot carry; set runtime.model_process: false$"):
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    cfg = load_config(path, environ={})
    assert get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg).results == {"y": "y"}
    # a codec class of one's own is held to the same check: the wire carries the model's outputs whatever the codec
    path = _config(tmp_path, model=str(odd_outputs(tmp_path / "odd.onnx")), codec="tests.own_models:CsvCodec")
    cfg = load_config(path, on, environ={})
    with pytest.raises(UserError, match="^pipeline 'mine': 'parts' is a seq"):
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)


def test_outputs_that_are_not_rows_are_refused_by_name(tmp_path):
    from tests.own_models import odd_outputs

    g = read_graph(odd_outputs(tmp_path / "odd.onnx"))
    with pytest.raises(ValueError, match="^outputs.total: output 'total' is a scalar, not one row per request$"):
        TensorJsonCodec(g.inputs, g.outputs)
    with pytest.raises(ValueError, match="^outputs.p: output 'parts' is a seq\\(tensor\\(float\\)\\): tensor-json maps "
                       "tensors and sequences of maps \\(one per row\\); leave it out of outputs$"):
        TensorJsonCodec(g.inputs, g.outputs, results={"p": "parts"})


def test_inspect_runs_the_model_and_leaves_out_outputs_without_a_row_per_request(tmp_path, capsys):
    from tests.own_models import odd_outputs

    odd_outputs(tmp_path / "odd.onnx")
    assert main(["inspect", str(tmp_path / "odd.onnx")]) == 0
    out = capsys.readouterr().out
    assert "  parts  seq(tensor(float))  -" in out
    assert "got a row each from 1 of 3 outputs" in out
    assert "output      'total' gave a scalar for 3 requests, not one row each: left out of the starter config" in out
    assert "output      'parts' gave 1 row for 3 requests, not one row each: left out of the starter config" in out
    (tmp_path / "odd.yaml").write_text(out.split("odd.yaml`):\n", 1)[1])
    cfg = load_config(tmp_path / "odd.yaml", environ={})
    assert cfg.pipelines[0]["outputs"] == {"y": "y"}
    assert get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg).results == {"y": "y"}  # the config works


@pytest.fixture(scope="module")
def lightgbm_model(tmp_path_factory) -> Path:
    pytest.importorskip("lightgbm")
    pytest.importorskip("onnxmltools")
    from tests.own_models import lightgbm_classifier

    return lightgbm_classifier(tmp_path_factory.mktemp("lgbm") / "churn.onnx")


def test_inspect_describes_a_lightgbm_zipmap_and_its_sample_result_is_the_workers(lightgbm_model, tmp_path, capsys):
    assert main(["inspect", str(lightgbm_model)]) == 0
    out = capsys.readouterr().out
    assert "  label          tensor(int64)                  [1]\n" in out
    assert "  probabilities  seq(map(int64,tensor(float)))  -\n" in out
    assert "batching    yes: dimension 0 of every input is dynamic (?); 3 sample requests in one batch got a row each " \
           "from every output" in out
    # onnxmltools declares label [1]; what it gives decides, not the declaration
    assert "output      'label' is declared [1] but gives one row per request (3 rows for 3)" in out
    sample = out.split("left out):\n", 1)[1].split("\n", 1)[0]
    shown = json.loads(out.split("becomes an object):\n", 1)[1].split("\n", 1)[0])
    (tmp_path / "churn.yaml").write_text(out.split("churn.yaml`):\n", 1)[1])
    cfg = load_config(tmp_path / "churn.yaml", environ={})
    codec = get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    from pipeline.runtime.session import InferenceSession

    d = codec.decode(sample.encode(), None)
    result = codec.split(InferenceSession(lightgbm_model, "cpu", 1).run(codec.collate([d.payload])), [d])[0]
    assert shown == result and set(result["probabilities"]) == {"0", "1", "2"}
    alone = run_alone(lightgbm_model, {"features": d.payload["features"]})
    assert result["label"] == int(alone["label"][0])
    assert result["probabilities"] == {str(k): v for k, v in alone["probabilities"][0].items()}


def test_codec_class_of_ones_own(tmp_path):
    from tests.own_models import tree_classifier

    model = str(tree_classifier(tmp_path / "trees.onnx"))
    cfg = load_config(_config(tmp_path, model=model, codec="tests.own_models:CsvCodec",
                              codec_options={"separator": ";"}), environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    codec = spec.make_codec(cfg)
    _key, value, _headers = spec.make_samples(1)(4)  # the class's own sample_request
    assert value == b"s4;1;0.5;-1"
    from pipeline.runtime.session import InferenceSession
    from pipeline.scoring import ScoringStep

    step = ScoringStep(spec.load_model(), codec, InferenceSession(Path(model), "cpu", 1))
    step.warm_up(spec)  # the worker's warm-up runs on the class's samples
    results, _ = step.infer([codec.decode(b"a;0.2;0;-3", None), codec.decode(b"b;0.9;0;0", None)])
    alone = run_alone(Path(model), {"x": np.array([[0.2, 0, -3], [0.9, 0, 0]], np.float32)})
    assert results == [{"label": int(label)} for label in alone["label"]]


@pytest.mark.parametrize(("entry", "reason"), [
    ({"codec": "tests.nope:Codec"}, "codec tests.nope:Codec: cannot import it: ModuleNotFoundError"),
    ({"codec": "tests.own_models:Nope"}, "codec tests.own_models:Nope: cannot import it: AttributeError"),
    ({"codec": "tests.own_models:CsvCodec", "codec_options": {"sep": ";"}},
     "codec_options.sep is not one of its arguments (separator)"),
    ({"codec": "collections:OrderedDict"}, "not a codec: it has no decode, collate, split"),
])
def test_codec_class_errors_are_one_line(tmp_path, entry, reason):
    cfg = load_config(_config(tmp_path, model=str(ranker(tmp_path / "m.onnx")), **entry), environ={})
    with pytest.raises(UserError) as exc:
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    assert reason in str(exc.value) and "\n" not in str(exc.value)


def test_codec_name_and_options_are_checked_with_the_config(tmp_path):
    with pytest.raises(UserError, match="'pipelines\\[0\\].codec': 'a b' is not one of tensor-json, tensor-binary, ctr, camera, text, nor a class"):
        load_config(_config(tmp_path, codec="a b"), environ={})
    with pytest.raises(UserError, match="'pipelines\\[0\\].codec_options': only for a codec class of your own"):
        load_config(_config(tmp_path, codec_options={"x": 1}), environ={})


def test_samples_file_feeds_the_warm_up(model, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"request_id": "a", "dense": [1, 2, 3, 4], "tokens": [1, 2]}\n\n')
    cfg = load_config(_config(tmp_path, model=str(model), samples=str(samples)), environ={})
    make = get_pipeline(cfg.pipeline, cfg.pipelines).make_samples(1)
    assert make(0) == make(5) == (None, samples.read_bytes().strip(), [])
    samples.write_text("\n")
    with pytest.raises(UserError, match="samples file .*: no requests in it"):
        get_pipeline(cfg.pipeline, cfg.pipelines).make_samples(1)


# ----------------------------------------------------------------------------- ragged sequences
@pytest.fixture(scope="module")
def masked(tmp_path_factory) -> Path:
    from tests.own_models import masked_encoder

    return masked_encoder(tmp_path_factory.mktemp("masked") / "masked.onnx")


def test_ragged_sequences_share_a_bucket_and_equal_the_model_alone(masked):
    from pipeline.runtime.session import InferenceSession

    g = read_graph(masked)
    codec = TensorJsonCodec(g.inputs, g.outputs, pad={"dimension": "seq", "buckets": [4, 8]})
    assert [f.name for f in codec.fields] == ["tokens"]  # the mask is found and filled, not asked for
    lengths = [1, 3, 4, 2, 5, 8, 7]
    docs = [{"request_id": f"r{n}", "tokens": [(3 * n + i) % 10 for i in range(n)]} for n in lengths]
    decoded = [codec.decode(json.dumps(doc).encode(), None) for doc in docs]
    assert [d.bucket for d in decoded] == [((4,), (4,))] * 4 + [((8,), (8,))] * 3
    assert decoded[1].payload["attention_mask"].tolist() == [[1, 1, 1, 0]]
    assert decoded[1].payload["tokens"].tolist() == [[9, 0, 1, 0]]
    session = InferenceSession(g.path, "cpu", 1)
    results = []
    for group in (decoded[:4], decoded[4:]):  # one batch per bucket, as the batching core forms them
        results += codec.split(session.run(codec.collate([d.payload for d in group], pad_to_rows=8)), group)
    for doc, result in zip(docs, results, strict=True):
        n = len(doc["tokens"])
        alone = run_alone(masked, {"tokens": np.array([doc["tokens"]], np.int64),
                                   "attention_mask": np.ones((1, n), np.int64)})
        assert np.allclose(result["pooled"], alone["pooled"][0], rtol=1e-6, atol=1e-7)
        assert np.array(result["states"]).shape == (n, 3)  # the per-position output is cut to the request's length
        assert np.allclose(result["states"], alone["states"][0], rtol=1e-6, atol=1e-7)


def test_ragged_rows_many_and_a_request_over_the_largest_bucket(masked):
    g = read_graph(masked)
    codec = TensorJsonCodec(g.inputs, g.outputs, rows="many", pad={"dimension": "seq", "buckets": [4], "mask": "attention_mask"})
    d = codec.decode(b'{"request_id": "r", "tokens": [[1, 2], [3, 4]]}', None)
    assert d.payload["attention_mask"].tolist() == [[1, 1, 0, 0]] * 2
    with pytest.raises(DecodeError, match=r"^tokens: dimension 'seq' has size 5, over the largest bucket \(4\)$"):
        codec.decode(b'{"request_id": "r", "tokens": [[1, 2, 3, 4, 5]]}', None)


@pytest.mark.parametrize(("pad", "fields", "reason"), [
    ({"dimension": "len", "buckets": [4]}, None, "pad.dimension: no input has a dimension 'len'; named dynamic dimensions: seq"),
    ({"dimension": "seq", "buckets": [8, 4]}, None, "pad.buckets: expected ascending sizes >= 1, e.g. [16, 32, 64], got [8, 4]"),
    ({"dimension": "seq", "buckets": [4], "mask": "nope"}, None, "pad.mask: 'nope' is not a numeric or bool input shaped [batch, seq]"),
    ({"dimension": "seq", "buckets": [4], "fill": 0}, None, "pad.fill: is not known; use dimension, buckets, mask, value"),
    ({"dimension": "seq", "buckets": [4]}, {"tokens": "tokens", "m": "attention_mask"},
     "inputs.m: 'attention_mask' is the mask the codec fills (pad.mask); leave it out"),
])
def test_pad_settings_that_do_not_fit_the_model(masked, pad, fields, reason):
    g = read_graph(masked)
    with pytest.raises(ValueError) as exc:
        TensorJsonCodec(g.inputs, g.outputs, fields, pad=pad)
    assert str(exc.value).startswith(reason)


def test_padding_needs_a_mask(model):
    g = read_graph(model)  # the ranker averages over every position: padding would change its results
    with pytest.raises(ValueError, match="^pad.mask: name the model's mask input over 'seq'"):
        TensorJsonCodec(g.inputs, g.outputs, pad={"dimension": "seq", "buckets": [4]})


def test_pad_from_the_configuration_and_its_warm_up_samples(masked, tmp_path):
    cfg = load_config(_config(tmp_path, model=str(masked), pad={"dimension": "seq", "buckets": [16, 32]},
                              sample_dims={"seq": 5}), environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    codec = spec.make_codec(cfg)
    _key, value, _headers = spec.make_samples(1)(0)
    assert "attention_mask" not in json.loads(value)
    d = codec.decode(value, None)
    assert d.payload["tokens"].shape == (1, 16) and d.payload["attention_mask"].sum() == 5
    with pytest.raises(UserError, match="'pipelines\\[0\\].pad': is a tensor-json setting"):
        load_config(_config(tmp_path, codec="tests.own_models:CsvCodec", pad={"dimension": "seq"}), environ={})


def test_inspect_suggests_padding_where_the_model_has_a_mask_and_the_hint_works(masked, model, tmp_path, capsys):
    assert main(["inspect", str(masked)]) == 0
    out = capsys.readouterr().out
    hint = "add pad: {dimension: seq, buckets: [16, 32, 64, 128]} to the entry"
    assert f"or pad ragged 'seq' to buckets, the codec filling mask 'attention_mask': {hint}" in out
    sample = json.loads(out.split("left out):\n", 1)[1].split("\n", 1)[0])
    assert sample["attention_mask"] == [1, 1, 1]  # all positions real: a masked mean of none is 0/0
    assert "null" not in out.split("becomes an object):\n", 1)[1].split("\n", 1)[0]
    config = yaml.safe_load(out.split("masked.yaml`):\n", 1)[1])
    config["pipelines"][0]["pad"] = yaml.safe_load(hint.removeprefix("add ").removesuffix(" to the entry"))["pad"]
    del config["pipelines"][0]["inputs"]["attention_mask"]  # the codec fills it now
    (tmp_path / "masked.yaml").write_text(yaml.safe_dump(config))
    cfg = load_config(tmp_path / "masked.yaml", environ={})
    d = get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg).decode(b'{"request_id": "r", "tokens": [1, 2]}', None)
    assert d.payload["attention_mask"].shape == (1, 16)
    assert main(["inspect", str(model)]) == 0
    assert "or pad ragged" not in capsys.readouterr().out  # the ranker has no mask: padding would change results
