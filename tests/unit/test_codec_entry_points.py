"""Issue 20: a codec class named by an installed package's `tidebatch.codecs` entry
point (pipeline/registry/user_pipelines.py), found the way pip-installed packages are found:
a real `*.dist-info` with an entry_points.txt on sys.path, no mock of the lookup."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.registry.pipelines import get_pipeline
from tests.own_models import run_alone, tree_classifier

pytest.importorskip("onnx")


@pytest.fixture
def installed(tmp_path, monkeypatch) -> Path:
    """A package `acme_codecs` installed into tmp_path, naming `acme-csv` (the test
    suite's CsvCodec under another module) and `acme-broken` (no such class)."""
    site = tmp_path / "site"
    (site / "acme_codecs").mkdir(parents=True)
    (site / "acme_codecs" / "__init__.py").write_text("from tests.own_models import CsvCodec as AcmeCsv\n")
    info = site / "acme_codecs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-codecs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tidebatch.codecs]\nacme-csv = acme_codecs:AcmeCsv\nacme-broken = acme_codecs:Missing\n"
    )
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("acme_codecs", None)


def _config(tmp_path: Path, **entry) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pipeline": "mine", "pipelines": [{"name": "mine", **entry}]}))
    return path


def test_an_installed_entry_point_names_the_codec(installed, tmp_path):
    model = tree_classifier(tmp_path / "trees.onnx")
    cfg = load_config(_config(tmp_path, model=str(model), codec="acme-csv", codec_options={"separator": ";"}), environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    codec = spec.make_codec(cfg)
    assert type(codec).__name__ == "CsvCodec" and codec.separator == ";"
    d = codec.decode(b"a;0.2;0;-3")
    assert d.request_id == "a"
    np.testing.assert_array_equal(d.payload, np.array([[0.2, 0, -3]], np.float32))
    assert run_alone(model, {"x": d.payload})["label"].shape == (1,)


def test_an_unknown_codec_name_lists_the_installed_ones(installed, tmp_path):
    with pytest.raises(UserError) as exc:
        load_config(_config(tmp_path, model="m.onnx", codec="acme-cvs"), environ={})
    assert str(exc.value) == (
        "config key 'pipelines[0].codec': 'acme-cvs' is not one of tensor-json, tensor-binary, avro, protobuf, jsonschema, ctr, camera, text, "
        "nor a class as "
        "'package.module:Class', nor a codec installed under the 'tidebatch.codecs' entry points "
        "(acme-broken, acme-csv)"
    )


def test_an_entry_point_that_does_not_load_is_one_line(installed, tmp_path):
    from tests.own_models import ranker

    cfg = load_config(_config(tmp_path, model=str(ranker(tmp_path / "m.onnx")), codec="acme-broken"), environ={})
    with pytest.raises(UserError) as exc:
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    assert str(exc.value).startswith(
        "pipeline 'mine': codec acme-broken (acme_codecs:Missing, entry point of acme-codecs): cannot import it: AttributeError"
    )
    assert "\n" not in str(exc.value)
