"""Issue 48, item 5: what a new user serving a model of their own ran into
(docs/OWN_MODEL.md), each pinned here: the reasons of the tensor-json codec, `config
check` checking what `run` checks, the starter config's broker profile, and
`tidebatch read`'s lines. Fast: no Kafka."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.codecs.base import DecodeError
from pipeline.codecs.tensor_json import TensorJsonCodec
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

