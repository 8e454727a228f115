"""Issue 20, "Your own model": ragged sequences padded into buckets with an attention
mask (pipeline/codecs/tensor_pad.py), equal to the model run alone; pad settings that
do not fit, and `tidebatch inspect`'s padding hint. Fast: no Kafka."""

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
from pipeline.runtime.onnx_graph import read_graph
from tests.own_models import run_alone

pytest.importorskip("onnx")
from tests.unit.own_model.entries import write_config


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
    cfg = load_config(write_config(tmp_path, model=str(masked), pad={"dimension": "seq", "buckets": [16, 32]},
                              sample_dims={"seq": 5}), environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    codec = spec.make_codec(cfg)
    _key, value, _headers = spec.make_samples(1)(0)
    assert "attention_mask" not in json.loads(value)
    d = codec.decode(value, None)
    assert d.payload["tokens"].shape == (1, 16) and d.payload["attention_mask"].sum() == 5
    with pytest.raises(UserError, match="'pipelines\\[0\\].pad': is a tensor-json setting"):
        load_config(write_config(tmp_path, codec="tests.own_models:CsvCodec", pad={"dimension": "seq"}), environ={})


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
