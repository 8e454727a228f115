"""The `schema_registry:` section (pipeline/registry/schema_settings.py): checked when the
config loads with one line naming the key; secrets as the kafka: block's (${ENV},
@file:, *** in a dump, masked in printed text); the pipelines it turns into
schema-registry codecs; `tidebatch produce --format`'s records, which those codecs read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from consumers.secret_values import SECRETS, scrub
from pipeline.app.produce import schema_records
from pipeline.codecs.base import NotReady
from pipeline.codecs.schema_wire import SchemaWireCodec
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.registry import schema_settings
from pipeline.registry.pipelines import get_pipeline, pipeline_for
from pipeline.registry.schema_fetch import SchemaFetcher
from pipeline.registry.schema_settings import SchemaRegistryConfig, client_settings
from tests.own_models import ranker


def config(**registry: Any) -> Any:
    return load_config(overrides={"schema_registry": registry}, environ={})


@pytest.mark.parametrize(("registry", "error"), [
    ({"format": "thrift"}, "'schema_registry.format': 'thrift' is not one of avro, protobuf, jsonschema"),
    ({"format": "avro"}, "'schema_registry.url': is required: pipeline 'ctr' reads avro records through a schema registry"),
    ({"url": "registry:8081"}, "'schema_registry.url': expected http://HOST:PORT[/PATH] or https://..."),
    ({"url": "http://u:p@registry:8081"}, "'schema_registry.url': has credentials in it: set schema_registry.username"),
    ({"url": "http://r:8081", "username": "u"}, "'schema_registry.password': basic auth needs both"),
    ({"url": "http://r:8081", "username": "a:b", "password": "x"}, "'schema_registry.username': must not contain ':'"),
    ({"url": "http://r:8081", "key_location": "k.pem"}, "'schema_registry.certificate_location': a client certificate"),
    ({"url": "http://r:8081", "key_password": "x"}, "'schema_registry.key_password': is the password of key_location"),
    ({"url": "http://r:8081", "timeout_s": 0}, "'schema_registry.timeout_s': must be > 0"),
])
def test_the_section_is_checked_naming_the_key(registry: dict[str, Any], error: str) -> None:
    with pytest.raises(UserError) as refused:
        config(**registry)
    assert error in str(refused.value) and "\n" not in str(refused.value)
    assert "p@" not in str(refused.value)


def test_an_entry_with_a_schema_codec_needs_a_url_and_no_other_format(tmp_path: Path) -> None:
    entry = {"name": "mine", "model": str(tmp_path / "m.onnx"), "codec": "protobuf"}
    with pytest.raises(UserError, match="'schema_registry.url': is required: pipeline 'mine' reads protobuf records"):
        load_config(overrides={"pipeline": "mine", "pipelines": [entry]}, environ={})
    with pytest.raises(UserError, match="'schema_registry.format': avro, but pipeline 'mine' has codec protobuf"):
        load_config(overrides={"pipeline": "mine", "pipelines": [entry],
                               "schema_registry": {"url": "http://r:8081", "format": "avro"}}, environ={})


def test_secrets_are_resolved_redacted_and_masked(tmp_path: Path) -> None:
    key_password = tmp_path / "key-password"
    key_password.write_text("kp-5ecret-from-a-file\n")
    cfg = load_config(overrides={"schema_registry": {
        "url": "https://registry:8081", "username": "tidebatch", "password": "${REG_PW}",
        "ca_location": "/ca.pem", "certificate_location": "/c.pem", "key_location": "/k.pem",
        "key_password": f"@file:{key_password}"}}, environ={})
    assert "${REG_PW}" not in repr(cfg.schema_registry) and "password='***'" in repr(cfg.schema_registry)
    SECRETS.clear()
    try:
        conf = client_settings(cfg.schema_registry, {"REG_PW": "pw-from-the-environment"})
        assert conf == {"url": "https://registry:8081", "timeout": 5.0, "max.retries": 0,
                        "basic.auth.user.info": "tidebatch:pw-from-the-environment", "ssl.ca.location": "/ca.pem",
                        "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem",
                        "ssl.key.password": "kp-5ecret-from-a-file"}
        assert "pw-from-the-environment" not in scrub(str(conf)) and "kp-5ecret" not in scrub(str(conf))
    finally:
        SECRETS.clear()
    with pytest.raises(UserError, match="config key schema_registry.password: environment variable REG_PW is not set"):
        client_settings(cfg.schema_registry, {})


def test_environment_overrides_reach_the_section() -> None:
    cfg = load_config(environ={"TIDEBATCH_SCHEMA_REGISTRY__URL": "http://r:8081",
                               "TIDEBATCH_SCHEMA_REGISTRY__FORMAT": "protobuf"})
    assert (cfg.schema_registry.url, cfg.schema_registry.format) == ("http://r:8081", "protobuf")


def test_format_puts_the_ctr_codec_behind_the_schema_registry() -> None:
    cfg = config(url="mock://settings", format="jsonschema")
    codec = pipeline_for(cfg).make_codec(cfg)
    assert isinstance(codec, SchemaWireCodec) and codec.name == "jsonschema"
    assert type(codec.inner).__name__ == "CtrCodec" and codec.writer.subject == "ctr.scores-value"
    assert type(pipeline_for(config()).make_codec(config())).__name__ == "CtrCodec"  # no format: as before


def test_an_entry_with_codec_avro_reads_tensor_json_documents(tmp_path: Path) -> None:
    model = ranker(tmp_path / "m.onnx")
    entry = {"name": "mine", "model": str(model), "codec": "avro", "inputs": {"features": "dense", "tokens": "tokens"},
             "output_topic": "mine.out"}
    cfg = load_config(overrides={"pipeline": "mine", "pipelines": [entry], "schema_registry": {"url": "mock://e"}},
                      environ={})
    spec = pipeline_for(cfg)
    codec = spec.make_codec(cfg)
    assert isinstance(codec, SchemaWireCodec) and isinstance(codec.inner, TensorJsonCodec)
    assert [f.name for f in codec.request.fields][-2:] == ["features", "tokens"]
    assert codec.writer.subject == "mine.out-value"
    _key, value, _headers = spec.make_samples(1)(0)  # samples are documents (JSON), for the warm-up
    assert set(orjson.loads(value)) == {"request_id", "features", "tokens"}
    with pytest.raises(UserError, match="pipeline 'mine' reads avro records: set schema_registry.url"):
        spec.make_codec(None)


def test_produce_sends_records_the_workers_codec_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    client = SchemaRegistryClient.new_client({"url": "mock://produce"})
    monkeypatch.setattr(schema_settings, "make_client", lambda settings, environ=None: client)
    spec = get_pipeline("ctr")
    samples = spec.make_samples(2)
    make = schema_records(spec, "protobuf", SchemaRegistryConfig(url="mock://produce"), "ctr.requests", samples)
    fetcher = SchemaFetcher(thread=False)
    codec = SchemaWireCodec("protobuf", spec.document_codec(), client, fetcher, "ctr", "ctr.scores")  # the worker's
    key, value, _ = make(4)
    assert key == samples(4)[0] and value[0] == 0
    with pytest.raises(NotReady):
        codec.decode(value)
    fetcher.step()
    assert codec.decode(value).request_id == orjson.loads(samples(4)[1])["request_id"]
    with pytest.raises(UserError, match="--format avro needs --schema-registry URL"):
        schema_records(spec, "avro", None, "t", samples)
    with pytest.raises(UserError, match="pipeline 'camera''s requests have no document form"):
        schema_records(get_pipeline("camera"), "avro", SchemaRegistryConfig(url="mock://x"), "t", samples)


def test_config_check_resolves_the_registry_secrets_as_run_does() -> None:
    from pipeline.app.check import resolve_secrets

    cfg = config(url="http://r:8081", username="u", password="${REG_PW}")
    with pytest.raises(UserError, match="schema_registry.password: environment variable REG_PW is not set"):
        resolve_secrets(cfg, {})
    resolve_secrets(cfg, {"REG_PW": "x" * 12})


def test_config_check_makes_the_codec_and_leaves_secrets_alone_with_no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.app.check import check_config

    monkeypatch.delenv("REG_PW", raising=False)
    cfg = config(url="mock://check", format="protobuf", username="u", password="${REG_PW}")
    assert check_config(cfg, None).pipeline == "ctr"  # --no-env: the codec made, the reference not resolved
    with pytest.raises(UserError, match="schema_registry.password: environment variable REG_PW is not set"):
        check_config(cfg, {})


def test_without_the_registry_extra_a_schema_codec_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """confluent-kafka's Avro module imports fastavro, which only the registry extra brings."""
    import importlib

    from pipeline import extras

    real = importlib.import_module

    def without_fastavro(name: str, *args: Any) -> Any:
        if name.startswith("pipeline.codecs.schema"):
            raise ModuleNotFoundError("No module named 'fastavro'", name="fastavro")
        return real(name, *args)

    monkeypatch.setattr(extras.importlib, "import_module", without_fastavro)
    cfg = config(url="mock://x", format="avro")
    with pytest.raises(UserError) as missing:
        pipeline_for(cfg).make_codec(cfg)
    assert str(missing.value) == ("schema-registry records (avro, protobuf, jsonschema) needs confluent-kafka: "
                                  "pip install 'tidebatch[registry]'")
