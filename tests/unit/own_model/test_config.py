"""Issue 20, "Your own model": pipelines defined in the configuration (`pipelines:`):
errors naming the key, the pipeline spec they make, outputs refused at start, LightGBM
and ZipMap outputs, a codec class of one's own, warm-up samples. Fast: no Kafka."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.registry.pipelines import get_pipeline
from pipeline.runtime.onnx_graph import read_graph
from tests.own_models import ranker, run_alone

pytest.importorskip("onnx")
from tests.unit.own_model.entries import write_config


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
        load_config(write_config(tmp_path, **entry), environ={})
    assert str(exc.value).startswith(reason)


def test_unknown_pipeline_lists_the_defined_ones(tmp_path):
    with pytest.raises(UserError, match="unknown pipeline 'other'.*defined under pipelines: mine"):
        load_config(write_config(tmp_path), {"pipeline": "other"}, environ={})


def test_defined_pipeline_is_a_pipeline_spec(model, tmp_path):
    cfg = load_config(write_config(tmp_path, model=str(model), version=3, max_batch_rows=64,
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
    cfg = load_config(write_config(tmp_path, model=str(tmp_path / "absent.onnx")), environ={})
    with pytest.raises(UserError, match="model file not found: .*absent.onnx"):
        get_pipeline(cfg.pipeline, cfg.pipelines).load_model()


def test_model_process_carries_a_zipmap_and_refuses_a_sequence_of_tensors_at_start(tmp_path):
    from tests.own_models import odd_outputs, tree_classifier

    on = {"runtime": {"model_process": True}}
    cfg = load_config(write_config(tmp_path, model=str(tree_classifier(tmp_path / "trees.onnx"))), on, environ={})
    assert get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg).results == {
        "label": "label", "probabilities": "probabilities"}  # pipeline/runtime/wire_values.py carries it
    path = write_config(tmp_path, model=str(odd_outputs(tmp_path / "odd.onnx")), outputs={"y": "y"})
    cfg = load_config(path, on, environ={})
    with pytest.raises(UserError, match="^pipeline 'mine': 'parts' is a seq\\(tensor\\(float\\)\\), which runtime.model_process "
                       "cannot carry; set runtime.model_process: false$"):
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    cfg = load_config(path, environ={})
    assert get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg).results == {"y": "y"}
    # a codec class of one's own is held to the same check: the wire carries the model's outputs whatever the codec
    path = write_config(tmp_path, model=str(odd_outputs(tmp_path / "odd.onnx")), codec="tests.own_models:CsvCodec")
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
    cfg = load_config(write_config(tmp_path, model=model, codec="tests.own_models:CsvCodec",
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
    cfg = load_config(write_config(tmp_path, model=str(ranker(tmp_path / "m.onnx")), **entry), environ={})
    with pytest.raises(UserError) as exc:
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    assert reason in str(exc.value) and "\n" not in str(exc.value)


def test_codec_name_and_options_are_checked_with_the_config(tmp_path):
    with pytest.raises(UserError, match="'pipelines\\[0\\].codec': 'a b' is not one of tensor-json, tensor-binary, avro, protobuf, jsonschema, ctr, camera, text, nor a class"):
        load_config(write_config(tmp_path, codec="a b"), environ={})
    with pytest.raises(UserError, match="'pipelines\\[0\\].codec_options': only for a codec class of your own"):
        load_config(write_config(tmp_path, codec_options={"x": 1}), environ={})


def test_samples_file_feeds_the_warm_up(model, tmp_path):
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"request_id": "a", "dense": [1, 2, 3, 4], "tokens": [1, 2]}\n\n')
    cfg = load_config(write_config(tmp_path, model=str(model), samples=str(samples)), environ={})
    make = get_pipeline(cfg.pipeline, cfg.pipelines).make_samples(1)
    assert make(0) == make(5) == (None, samples.read_bytes().strip(), [])
    samples.write_text("\n")
    with pytest.raises(UserError, match="samples file .*: no requests in it"):
        get_pipeline(cfg.pipeline, cfg.pipelines).make_samples(1)
