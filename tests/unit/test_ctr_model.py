"""The shipped CTR model: loads in ONNX Runtime, batching does not change scores, the
spec matches the file, and registry errors are one line."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnxruntime as ort
import pytest

from models import registry
from models.ctr import features as F
from models.registry import ModelSpec, load_spec
from pipeline.codecs.ctr import CtrCodec
from pipeline.errors import UserError
from pipeline.loadgen.ctr import CtrRequestFactory


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    return load_spec("ctr")


@pytest.fixture(scope="module")
def session(spec: ModelSpec) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(spec.onnx_path), opts, providers=["CPUExecutionProvider"])


def run(session: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return session.run(["prob"], feeds)[0]


def test_spec_describes_the_onnx_file(spec, session):
    assert spec.name == "ctr_deepfm" and spec.version
    assert spec.onnx_path.is_absolute() and spec.onnx_path.name == "ctr_deepfm.onnx"
    assert hashlib.sha256(spec.onnx_path.read_bytes()).hexdigest() == spec.raw["sha256"]
    assert [(i.name, i.type) for i in session.get_inputs()] == [
        ("dense", "tensor(float)"),
        ("cat", "tensor(int64)"),
    ]
    assert [i["name"] for i in spec.inputs] == ["dense", "cat"]
    assert [o["name"] for o in spec.outputs] == ["prob"]
    assert session.get_outputs()[0].name == "prob"
    assert spec.raw["hashing"]["salts"] == [hex(int(s)) for s in F.FIELD_SALTS]
    assert spec.raw["hashing"]["table_size"] == F.TABLE_SIZE
    assert spec.onnx_path.stat().st_size < 10_000_000


def test_onnx_opset_and_ir_version(spec):
    onnx = pytest.importorskip("onnx")
    proto = onnx.load(str(spec.onnx_path), load_external_data=False)
    assert proto.ir_version == spec.raw["onnx_ir_version"] <= 13
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [17]


def test_batched_scores_equal_unbatched(session):
    codec = CtrCodec()
    factory = CtrRequestFactory(seed=21, mean_items=15, max_items=80)
    decoded = [codec.decode(factory.make(i)[1], None) for i in range(24)]
    total = sum(d.rows for d in decoded)
    batched = codec.split(
        {"prob": run(session, codec.collate([d.payload for d in decoded]))}, decoded
    )
    padded_feeds = codec.collate([d.payload for d in decoded], pad_to_rows=total + 13)
    padded = codec.split({"prob": run(session, padded_feeds)}, decoded)
    worst = 0.0
    for d, b, p in zip(decoded, batched, padded, strict=True):
        alone = run(session, codec.collate([d.payload]))
        worst = max(worst, float(np.abs(np.array(b["scores"]) - alone).max()))
        worst = max(worst, float(np.abs(np.array(p["scores"]) - alone).max()))
        single_rows = [
            run(session, {"dense": d.payload.dense[k : k + 1], "cat": d.payload.cat[k : k + 1]})[0]
            for k in range(d.rows)
        ]
        worst = max(worst, float(np.abs(np.array(b["scores"]) - np.array(single_rows)).max()))
    assert worst <= 1e-5


def test_probabilities_are_in_the_open_unit_interval(session):
    rng = np.random.default_rng(0)
    n = 512
    dense = rng.lognormal(2.0, 2.0, (n, F.N_DENSE)).astype(np.float32)
    dense[rng.random((n, F.N_DENSE)) < 0.3] = np.nan
    dense[0] = np.nan  # everything missing
    dense[1] = 0.0
    dense[2] = 3e38  # saturates
    dense[3] = -7.0  # negative counts count as 0
    cat = rng.integers(0, F.TABLE_SIZE, (n, F.N_CAT), dtype=np.int64)
    cat[0] = F.MISSING_IDS
    p = run(session, {"dense": dense, "cat": cat})
    assert p.shape == (n,) and p.dtype == np.float32
    assert np.isfinite(p).all() and (p > 0).all() and (p < 1).all()
    assert p[3] == pytest.approx(run(session, {"dense": dense[1:2], "cat": cat[3:4]})[0], abs=1e-6)


def test_spec_reports_training_quality(spec):
    t = spec.raw["training"]
    assert 0.5 < t["heldout_auc_model"] <= t["heldout_auc_click_model"] < 1.0


# ---------------------------------------------------------------------------- registry errors
def one_line_user_error(name: str) -> str:
    with pytest.raises(UserError) as info:
        load_spec(name)
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("name", ["nope", "../models", "", "ctr/../ctr", ".hidden"])
def test_unknown_model(name):
    shipped = registry.shipped_models()
    assert "ctr" in shipped
    assert (
        one_line_user_error(name) == f"unknown model {name!r}; shipped models: {', '.join(shipped)}"
    )


def test_missing_onnx_and_broken_spec(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "MODELS_DIR", tmp_path)
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1" / "spec.json").write_text(
        json.dumps({"name": "m1", "version": "1", "file": "m1.onnx", "inputs": [], "outputs": []})
    )
    text = one_line_user_error("m1")
    assert text.startswith("model 'm1': ONNX file ") and "m1.onnx is missing" in text
    (tmp_path / "m2").mkdir()
    (tmp_path / "m2" / "spec.json").write_text("{not json")
    assert one_line_user_error("m2").startswith("model 'm2': cannot read ")
    (tmp_path / "m3").mkdir()
    (tmp_path / "m3" / "spec.json").write_text(json.dumps({"name": "m3", "file": "m3.onnx"}))
    assert one_line_user_error("m3").endswith("missing key 'version'")
    assert registry.shipped_models() == ["m1", "m2", "m3"]
    assert one_line_user_error("ctr") == "unknown model 'ctr'; shipped models: m1, m2, m3"
