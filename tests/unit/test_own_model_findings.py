"""Issue 48, item 5: what a new user serving a model of their own ran into
(docs/OWN_MODEL.md), each pinned here: the reasons of the tensor-json codec, `config
check` checking what `run` checks, the starter config's broker profile, and
`tidebatch read`'s lines. Fast: no Kafka."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.codecs.base import DecodeError
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.config import load_config
from pipeline.dlq.letters import DeadLetter
from pipeline.dlq.show import meta_line, value_line
from pipeline.errors import UserError
from pipeline.runtime.onnx_graph import read_graph
from tests.own_models import ranker

pytest.importorskip("onnx")

INT64 = "(-9223372036854775808..9223372036854775807)"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return ranker(tmp_path_factory.mktemp("findings") / "ranker.onnx")


@pytest.fixture(scope="module")
def codec(model) -> TensorJsonCodec:
    g = read_graph(model)
    return TensorJsonCodec(g.inputs, g.outputs, {"features": "dense", "tokens": "tokens"})


def _reason(codec: TensorJsonCodec, raw: bytes) -> str:
    with pytest.raises(DecodeError) as exc:
        codec.decode(raw, None)
    return str(exc.value)


def _req(features: str = "[0.1, 0.2, 0.3, 0.4]", tokens: str = "[1, 2]", extra: str = "") -> bytes:
    return f'{{"request_id": "r1", "features": {features}, "tokens": {tokens}{extra}}}'.encode()


# ----------------------------------------------------------------------------- codec reasons
@pytest.mark.parametrize("tokens", [
    "[1180591620717411303424]",  # the one the issue saw: 2**70, "expected int, got float" before
    "[3, -9223372036854775809]",
    "[18446744073709551616]",
    "[" + "9" * 5000 + "]",  # beyond the double range too
    "[9223372036854775808]",  # within 64 bits: the reason it always had
])
def test_an_integer_beyond_int64_is_out_of_range_not_a_float(codec, tokens):
    assert _reason(codec, _req(tokens=tokens)) == f"tokens: value out of range for int64 {INT64}"


def test_a_float_before_a_huge_integer_is_still_named_first(codec):
    assert _reason(codec, _req(tokens="[1.5, 1180591620717411303424]")) == "tokens[0]: expected int, got float"
    assert _reason(codec, _req(tokens="[1e400]")) == "tokens[0]: expected int, got float"


@pytest.mark.parametrize(("raw", "reason"), [
    (_req(features="[NaN, 0, 0, 0]"), "features[0]: NaN is not valid JSON (JSON numbers are finite)"),
    (_req(features="[0, Infinity, 0, 0]"), "features[1]: Infinity is not valid JSON (JSON numbers are finite)"),
    (_req(features="[0, 0, -Infinity, 0]"), "features[2]: -Infinity is not valid JSON (JSON numbers are finite)"),
    (_req(extra=', "meta": {"x": [1, NaN]}'), "meta.x[1]: NaN is not valid JSON (JSON numbers are finite)"),
])
def test_nan_and_infinity_name_their_field(codec, raw, reason):
    assert _reason(codec, raw) == reason


def test_malformed_json_with_nan_elsewhere_is_still_malformed(codec):
    assert _reason(codec, b'{"request_id": "r1", "features": [NaN, 0, 0, 0], "tokens": [1}').startswith("malformed JSON: ")


def test_unknown_request_fields_are_ignored(codec):
    """Documented (docs/OWN_MODEL.md, "The tensor-json codec"): a misspelt optional field
    is not refused, so a producer can add fields before the model reads them."""
    d = codec.decode(_req(extra=', "featurez": [1], "debug": {"a": 1}'), None)
    assert set(d.payload) == {"dense", "tokens"}


# ----------------------------------------------------------------------------- config check
def _config(tmp_path: Path, onnx: Path, **entry: object) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"pipeline": "mine", "pipelines": [
        {"name": "mine", "model": str(onnx), "inputs": {"features": "dense", "tokens": "tokens"}, **entry}]}))
    return path


def test_config_check_names_the_group_run_joins(model, tmp_path, capsys):
    assert main(["config", "check", str(_config(tmp_path, model)), "--no-env"]) == 0
    out = capsys.readouterr().out
    assert "group tidebatch-mine" in out and "group None" not in out
    assert f"model {model} version 1" in out


@pytest.mark.parametrize(("entry", "says"), [
    ({"inputs": {"features": "nope", "tokens": "tokens"}}, "inputs.features: the model has no input 'nope'"),
    ({"outputs": {"score": "nope"}}, "outputs.score: the model has no output 'nope'"),
    ({"model": "/nonexistent/model.onnx"}, "model file not found: /nonexistent/model.onnx"),
])
def test_config_check_refuses_what_run_refuses_with_runs_line(model, tmp_path, capsys, entry, says):
    """Issue 48: `check` said "valid" for these, and `run` then stopped at its model."""
    from pipeline.app.compose import build_parts

    path = _config(tmp_path, model, **entry)
    assert main(["config", "check", str(path), "--no-env"]) == 2
    shown = capsys.readouterr().err.strip()
    assert says in shown
    with pytest.raises(UserError) as run_says:  # what the worker's composition raises at start
        build_parts(load_config(path, environ={}))
    assert shown == f"tidebatch: error: {run_says.value}"


# ----------------------------------------------------------------------------- inspect
def test_the_starter_config_names_its_broker_profile(model, tmp_path, capsys):
    """Issue 48: without broker_profile, a worker on the embedded broker waited ~23 s
    for its partitions at every start."""
    assert main(["inspect", str(model), "--broker-profile", "embedded", "--config-only"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("pipeline: ranker\n") and "broker_profile: embedded  # the embedded Tansu broker; kafka for Apache Kafka" in text
    (tmp_path / "ranker.yaml").write_text(text)
    cfg = load_config(tmp_path / "ranker.yaml", environ={})
    assert (cfg.broker_profile, cfg.bootstrap_servers) == ("embedded", "127.0.0.1:9092")
    assert main(["inspect", str(model), "--bootstrap-servers", "kafka:9092"]) == 0
    report = capsys.readouterr().out
    assert "broker_profile: kafka  # Apache Kafka" in report and "bootstrap_servers: kafka:9092" in report


# ----------------------------------------------------------------------------- read
def test_read_prints_values_or_records_with_where_they_are():
    rec = DeadLetter("r.results", 1, 7, 1000, b"k", b'{"request_id": "a"}', [("h", b"\xff")])
    assert value_line(rec) == b'{"request_id": "a"}\n'
    doc = json.loads(meta_line(rec))
    assert doc == {"topic": "r.results", "partition": 1, "offset": 7, "timestamp_ms": 1000, "key": "k",
                   "headers": [["h", "base64:/w=="]], "value": '{"request_id": "a"}'}


def test_read_needs_a_broker(capsys):
    assert main(["read", "t"]) == 2
    assert "needs --bootstrap-servers or -c CONFIG" in capsys.readouterr().err

