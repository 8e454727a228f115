"""Issue 20 item 1: the shipped CTR, camera and text pipelines are `pipelines:` entries
(models/pipelines.yaml), checked and built by the same code as a user's entries
(pipeline/registry/keys.py, pipeline/registry/user_pipelines.py), their codecs found by name in
the one table (pipeline/registry/codecs.py), their sample requests made by the codecs'
optional `samples(seed)`. No Kafka, no model run."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.registry.pipelines import SHIPPED_FILE, get_pipeline, read_entries, shipped_names
from tests.own_models import CsvCodec

ROOT = Path(__file__).resolve().parents[2]
DATA = ("name", "input_topic", "output_topic", "warmup_sizes", "max_message_bytes", "max_request_bytes",
        "max_batch_rows")


def _written_entries() -> list[dict]:
    """The shipped entries as the file writes them (relative paths)."""
    return yaml.safe_load(SHIPPED_FILE.read_text())["pipelines"]


def _feeds_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_the_shipped_pipelines_are_the_entries_of_the_shipped_file() -> None:
    assert shipped_names() == [e["name"] for e in _written_entries()] == ["ctr", "camera", "text"]


@pytest.mark.parametrize("name", ["ctr", "camera", "text"])
def test_a_copy_of_a_shipped_entry_as_a_users_entry_is_the_same_pipeline(name, tmp_path, monkeypatch) -> None:
    """The entry copied verbatim into a config run from the repository root, under
    another name: the same spec, model, codec, samples and decoded arrays."""
    monkeypatch.chdir(ROOT)  # the shipped file's relative paths are from here
    entry = next(e for e in _written_entries() if e["name"] == name)
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump({"pipeline": f"my-{name}", "pipelines": [{**entry, "name": f"my-{name}"}]}))
    cfg = load_config(path, environ={})
    shipped_cfg = load_config(overrides={"pipeline": name}, environ={})
    mine, shipped = get_pipeline(cfg.pipeline, cfg.pipelines), get_pipeline(name)

    assert [getattr(mine, k) for k in DATA] == [f"my-{name}", *(getattr(shipped, k) for k in DATA[1:])]
    assert mine.load_model() == shipped.load_model()
    codec, shipped_codec = mine.make_codec(cfg), shipped.make_codec(shipped_cfg)
    assert type(codec) is type(shipped_codec) and codec.name == name
    make, shipped_make = mine.make_samples(5), shipped.make_samples(5)
    samples = [make(i) for i in range(3)]
    assert samples == [shipped_make(i) for i in range(3)]
    decoded = [codec.decode(v, dict(h)) for _k, v, h in samples[:1]]
    shipped_decoded = [shipped_codec.decode(v, dict(h)) for _k, v, h in samples[:1]]
    _feeds_equal(codec.collate([d.payload for d in decoded]), shipped_codec.collate([d.payload for d in shipped_decoded]))


def test_the_shipped_file_is_checked_with_the_config_entries_one_line_errors(tmp_path) -> None:
    broken = tmp_path / "pipelines.yaml"
    for entry, reason in [
        ({"codec": "a b"}, "key 'pipelines[0].codec': 'a b' is not one of tensor-json, tensor-binary, avro, protobuf, jsonschema, ctr, camera"),
        ({"warmup_sizes": [1, 0]}, "key 'pipelines[0].warmup_sizes': expected a list of ints >= 1, got [1, 0]"),
        ({"max_message_bytes": 2048, "max_request_bytes": 4096},
         "key 'pipelines[0].max_message_bytes': must be >= max_request_bytes"),
        ({"version": "2"}, "key 'pipelines[0].version': a model given by its spec.json has the spec's own version"),
    ]:
        broken.write_text(yaml.safe_dump({"pipelines": [{**_written_entries()[0], **entry}]}))
        with pytest.raises(UserError) as exc:
            read_entries(broken, tmp_path)
        assert str(exc.value).startswith(f"pipelines.yaml: {reason}") and "\n" not in str(exc.value)
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({"pipeline": "x", "pipelines": [{**_written_entries()[0], "name": "x", **entry}]}))
        with pytest.raises(UserError) as same:
            load_config(config, environ={})
        assert str(same.value).startswith(f"config key {reason.removeprefix('key ')}")


@pytest.mark.parametrize("name", ["ctr", "camera", "text"])
def test_a_users_entry_may_not_take_a_shipped_name(name, tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pipeline": name, "pipelines": [{"name": name, "model": "m.onnx"}]}))
    with pytest.raises(UserError) as exc:
        load_config(path, environ={})
    assert str(exc.value) == (
        f"config key 'pipelines[0].name': {name!r} is a shipped pipeline (models/pipelines.yaml); pick another "
        "name, or change the shipped one with the worker's own keys (input_topic, batching, codec)"
    )


def test_every_limit_a_pipeline_spec_carries_is_an_entry_key(tmp_path) -> None:
    pytest.importorskip("onnx")
    from tests.own_models import ranker

    model = ranker(tmp_path / "m.onnx")
    path = tmp_path / "c.yaml"
    limits = {"warmup_sizes": [1, 3], "max_batch_rows": 16, "max_request_bytes": 4096, "max_message_bytes": 65536}
    path.write_text(yaml.safe_dump({"pipeline": "r", "pipelines": [{"name": "r", "model": str(model), **limits}]}))
    cfg = load_config(path, environ={})
    spec = get_pipeline(cfg.pipeline, cfg.pipelines)
    assert (spec.warmup_sizes, spec.max_batch_rows, spec.max_request_bytes, spec.max_message_bytes) == (
        (1, 3), 16, 4096, 65536)
    # without max_message_bytes: the request limit and room for headers, as before
    path.write_text(yaml.safe_dump({"pipeline": "r", "pipelines": [{"name": "r", "model": str(model),
                                                                    "max_request_bytes": 4096}]}))
    cfg = load_config(path, environ={})
    assert get_pipeline(cfg.pipeline, cfg.pipelines).max_message_bytes == 4096 + 64 * 1024


def test_the_worker_config_reaches_a_codec_class_over_its_entry(tmp_path) -> None:
    ctr = get_pipeline("ctr")
    assert ctr.make_codec(load_config(overrides={"pipeline": "ctr"}, environ={})).max_items == 1000
    assert ctr.make_codec(load_config(overrides={"pipeline": "ctr", "max_items": 7}, environ={})).max_items == 7
    cfg = load_config(overrides={"pipeline": "ctr", "max_items": 7, "codec": {"max_items": 5}}, environ={})
    assert ctr.make_codec(cfg).max_items == 5  # the codec section names the codec's own argument
    with pytest.raises(UserError, match=r"pipeline 'ctr': codec ctr: config key 'codec.pad_to' is not one of its "
                                        r"arguments \(max_items\)"):
        ctr.make_codec(load_config(overrides={"pipeline": "ctr", "codec": {"pad_to": "longest"}}, environ={}))


def test_a_codec_section_for_tensor_json_is_refused_not_ignored(tmp_path) -> None:
    pytest.importorskip("onnx")
    from tests.own_models import ranker

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pipeline": "r", "codec": {"pad_to": "longest"},
                                    "pipelines": [{"name": "r", "model": str(ranker(tmp_path / "m.onnx"))}]}))
    cfg = load_config(path, environ={})
    with pytest.raises(UserError) as exc:
        get_pipeline(cfg.pipeline, cfg.pipelines).make_codec(cfg)
    assert str(exc.value) == ("config key 'codec.pad_to': pipeline 'r''s codec tensor-json takes no options; "
                              "its entry's inputs, outputs, rows, pad set it")


class SampledCsv(CsvCodec):
    """A user's codec class with its own samples(seed), as the shipped codecs have."""

    def samples(self, seed: int):
        return lambda i: (b"k", f"s{seed}-{i},1,2,3".encode(), [("h", b"v")])


def test_a_users_codec_gives_its_own_samples_as_the_shipped_ones_do(tmp_path) -> None:
    pytest.importorskip("onnx")
    from tests.own_models import tree_classifier

    path = tmp_path / "c.yaml"
    model = tree_classifier(tmp_path / "trees.onnx")
    path.write_text(yaml.safe_dump({"pipeline": "t", "pipelines": [
        {"name": "t", "model": str(model), "codec": "tests.unit.test_shipped_entries:SampledCsv"}]}))
    cfg = load_config(path, environ={})
    make = get_pipeline(cfg.pipeline, cfg.pipelines).make_samples(9)
    assert make(4) == (b"k", b"s9-4,1,2,3", [("h", b"v")])  # samples(seed) over sample_request(i)


def test_the_shipped_file_is_package_data() -> None:
    """CI installs the repository with pip: the file must travel with the `models` package."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tools = meta["tool"]["setuptools"]
    assert any(fnmatch.fnmatch("models", p) for p in tools["packages"]["find"]["include"])
    patterns = tools["package-data"].get("*", []) + tools["package-data"].get("models", [])
    assert any(fnmatch.fnmatch(SHIPPED_FILE.name, p) for p in patterns)
    assert (SHIPPED_FILE.parent / "__init__.py").is_file()
