"""The `schema_registry` section of the worker config, and the client and codec made
from it (docs/SCHEMA_REGISTRY.md, "Configuration"):

    schema_registry:
      url: https://registry.example.com:8081     # Confluent's API, or Apicurio's /apis/ccompat/v7
      format: avro              # the pipeline's records: avro, protobuf or jsonschema
      username: tidebatch       # basic auth
      password: ${REGISTRY_PASSWORD}             # or "@file:/run/secrets/registry-password"
      ca_location: /etc/tidebatch/registry-ca.pem            # TLS: the CA that signed the registry's certificate
      certificate_location: /etc/tidebatch/registry.crt      # mutual TLS: this client's certificate ...
      key_location: /etc/tidebatch/registry.key              # ... and its key
      key_password: ${REGISTRY_KEY_PASSWORD}
      timeout_s: 5              # per HTTP request

`format` puts the pipeline's own codec (ctr, tensor-json) behind the schema-registry
wire format; a `pipelines:` entry with `codec: avro` (protobuf, jsonschema) needs no
`format`. The password and the key's password are secrets like the `kafka:` block's
(consumers/client_settings.py): `${ENV}` or `@file:`, resolved when the client is made,
masked in every printed line from then on, `***` in a dumped config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from consumers.client_settings import redacted, resolve_secret
from pipeline.errors import UserError

FORMATS = ("avro", "protobuf", "jsonschema")  # pipeline/codecs/schema_records.py FORMATS
SECRET_FIELDS = ("password", "key_password")


@dataclass(repr=False)
class SchemaRegistryConfig:
    url: str | None = None
    # The records' format for a pipeline whose codec has a document form (ctr,
    # tensor-json): avro, protobuf or jsonschema. None: the codec's own form (JSON ...).
    format: str | None = None
    username: str | None = None
    password: str | None = None  # secret: ${ENV} or @file:
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = None  # secret: ${ENV} or @file:
    timeout_s: float = 5.0

    def __repr__(self) -> str:  # a dumped config must not show a secret
        shown = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return "SchemaRegistryConfig(" + ", ".join(f"{k}={v!r}" for k, v in redacted(shown, SECRET_FIELDS).items()) + ")"


def records_format(codec: str, settings: SchemaRegistryConfig | None) -> str | None:
    """The schema-registry format a pipeline with codec `codec` reads, or None: the
    codec's own name when it is one of FORMATS, else the section's `format`."""
    if codec in FORMATS:
        return codec
    return settings.format if settings is not None else None


def validate_schema_registry(settings: SchemaRegistryConfig, codec: str, pipeline: str,
                             bad: Callable[[str, str], Exception]) -> None:
    """What can be checked before the secrets are resolved; messages name keys only.
    `codec`: the codec of the selected pipeline."""
    s = settings
    if s.format is not None and s.format not in FORMATS:
        raise bad("schema_registry.format", f"{s.format!r} is not one of {', '.join(FORMATS)}")
    if s.format is not None and codec in FORMATS and codec != s.format:
        raise bad("schema_registry.format", f"{s.format}, but pipeline {pipeline!r} has codec {codec}; "
                  "leave format out (the codec says it)")
    if s.url is not None:
        parts = urlsplit(s.url)
        if parts.scheme not in ("http", "https", "mock") or not parts.netloc:
            raise bad("schema_registry.url", "expected http://HOST:PORT[/PATH] or https://...")
        if parts.username is not None or parts.password is not None:
            raise bad("schema_registry.url", "has credentials in it: set schema_registry.username and "
                      "schema_registry.password instead (a secret there is kept out of logs)")
    elif records_format(codec, s) is not None:
        raise bad("schema_registry.url", f"is required: pipeline {pipeline!r} reads "
                  f"{records_format(codec, s)} records through a schema registry")
    if (s.username is None) != (s.password is None):
        missing = "password" if s.password is None else "username"
        raise bad(f"schema_registry.{missing}", "basic auth needs both schema_registry.username and .password")
    if s.username is not None and ":" in s.username:
        raise bad("schema_registry.username", "must not contain ':' (basic auth separates user and password with it)")
    if (s.certificate_location is None) != (s.key_location is None):
        missing = "key_location" if s.key_location is None else "certificate_location"
        raise bad(f"schema_registry.{missing}", "a client certificate needs both certificate_location and key_location")
    if s.key_password is not None and s.key_location is None:
        raise bad("schema_registry.key_password", "is the password of key_location, which is not set")
    if s.timeout_s <= 0:
        raise bad("schema_registry.timeout_s", "must be > 0")


def client_settings(s: SchemaRegistryConfig, environ: Mapping[str, str]) -> dict[str, Any]:
    """confluent-kafka SchemaRegistryClient's settings, secrets resolved (and registered
    for masking: consumers/secret_values.py). No retries of its own: the fetcher
    (schema_fetch.py) retries, off the decoding thread."""
    if s.url is None:
        raise UserError("config key 'schema_registry.url' is required to read or write schema-registry records")
    conf: dict[str, Any] = {"url": s.url, "timeout": s.timeout_s, "max.retries": 0}
    if s.username is not None and s.password is not None:
        password = resolve_secret("schema_registry.password", s.password, environ, "config key")
        conf["basic.auth.user.info"] = f"{s.username}:{password}"
    for key, name in (("ca_location", "ssl.ca.location"), ("certificate_location", "ssl.certificate.location"),
                      ("key_location", "ssl.key.location")):
        if getattr(s, key) is not None:
            conf[name] = getattr(s, key)
    if s.key_password is not None:
        conf["ssl.key.password"] = resolve_secret("schema_registry.key_password", s.key_password, environ, "config key")
    return conf


def without_registry_secrets(cfg: Any) -> Any:
    """`cfg` with the registry's credentials left out (`config check --no-env`: the
    codec is made, its secrets not resolved)."""
    from dataclasses import replace

    s = cfg.schema_registry
    return replace(cfg, schema_registry=replace(s, username=None, password=None, key_password=None))


def make_client(s: SchemaRegistryConfig, environ: Mapping[str, str] | None = None) -> Any:
    """A SchemaRegistryClient for the section (mock:// URLs: confluent-kafka's in-memory
    client, for unit tests); UserError (one line) for settings it refuses."""
    import os

    from pipeline.extras import load

    SchemaRegistryClient = load("confluent_kafka.schema_registry", "registry").SchemaRegistryClient
    conf = client_settings(s, os.environ if environ is None else environ)
    try:
        return SchemaRegistryClient.new_client(conf)
    except (ValueError, TypeError, OSError) as exc:  # e.g. an unreadable CA file
        raise UserError(f"schema_registry: {type(exc).__name__}: {exc}".splitlines()[0]) from None


def schema_codec(pipeline: str, fmt: str, inner: Any, settings: SchemaRegistryConfig | None, output_topic: str,
                 environ: Mapping[str, str] | None = None) -> Any:
    """`inner` behind the schema-registry wire format `fmt` (pipeline/codecs/schema_wire.py),
    with a client from `settings` and a fetcher of its own."""
    from pipeline.extras import load
    from pipeline.registry.schema_fetch import SchemaFetcher

    SchemaWireCodec = load("pipeline.codecs.schema_wire", "registry").SchemaWireCodec
    if settings is None or settings.url is None:
        raise UserError(f"pipeline {pipeline!r} reads {fmt} records: set schema_registry.url in the config")
    try:
        return SchemaWireCodec(fmt, inner, make_client(settings, environ), SchemaFetcher(), pipeline, output_topic)
    except ValueError as exc:
        raise UserError(f"pipeline {pipeline!r}: codec {fmt}: {exc}") from None


def register_results(codec: Any) -> None:
    """Register a schema-registry codec's result schema now (the worker's start), so
    that no result waits for the registry; nothing for other codecs. UserError (one
    line) when the registry refuses it or cannot be reached."""
    register = getattr(codec, "register_results", None)
    if register is None:
        return
    try:
        register()
    except Exception as exc:  # the registry's answer, or none
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise UserError(f"schema registry: cannot register the result schema under "
                        f"{codec.writer.subject!r}: {text}") from None
