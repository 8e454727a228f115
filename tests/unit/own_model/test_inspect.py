"""Issue 20, "Your own model": reading a model's graph and header, and `tidebatch
inspect` (report, sample request, config entry), on models built here with onnx.helper
(tests/own_models.py). Fast: no Kafka."""

from __future__ import annotations

import pytest

from pipeline.cli import main
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.registry.pipelines import get_pipeline
from pipeline.runtime.onnx_graph import read_graph, read_header
from tests.own_models import fixed_batch

pytest.importorskip("onnx")

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
