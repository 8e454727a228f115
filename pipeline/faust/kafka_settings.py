"""The `kafka:` block (librdkafka names) → ``faust.App`` settings.

The Faust app talks to Kafka through aiokafka, which takes neither librdkafka's names
nor per-client credentials: Faust builds one ``broker_credentials`` (SASL user,
mechanism, TLS context) for its consumer and its producer, and creates topics with
the producer's connection (it has no admin client). So:

- security settings (``security.protocol``, ``sasl.*``, ``ssl.*``) and ``client.id``
  must come out the same for kafka.consumer, kafka.producer and kafka.admin;
- a consumer or producer tunable goes to Faust's consumer or producer setting (a
  producer's name in the consumer's settings is skipped, as librdkafka does);
- kafka.admin may only repeat what the producer gets;
- anything else is refused with one line naming the key, never silently dropped
  (a TLS CA or SASL mechanism lost on the way connects insecurely or not at all).

Secrets are resolved by consumers/client_settings.py and never appear in an error.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consumers.client_settings import REDACTED, ROLES, KafkaBlock, is_secret, settings_for
from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.config import KafkaOverrides

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# aiokafka's SASL mechanisms that a config file can set up; OAUTHBEARER needs a token
# provider object (librdkafka's sasl.oauthbearer.* OIDC client has no aiokafka twin).
_USER_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SASL_KEYS = frozenset({
    "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password", "sasl.kerberos.service.name",
})
_SSL_KEYS = frozenset({
    "ssl.ca.location", "ssl.ca.pem", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
    "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification",
})
# One value for every client of the app (Faust has one broker_credentials/client id).
_SHARED = _SASL_KEYS | _SSL_KEYS | {"security.protocol", "client.id"}


def _seconds(key: str, value: Any) -> float:
    return _number(key, value) / 1000.0


def _number(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UserError(f"Kafka setting {key}: expected a number, got {value!r}") from None


def _int(key: str, value: Any) -> int:
    return int(_number(key, value))


def _acks(key: str, value: Any) -> int:
    return -1 if str(value).lower() == "all" else _int(key, value)


def _as_is(key: str, value: Any) -> Any:
    return value


def _lower(key: str, value: Any) -> str:
    return str(value).lower()


_Convert = Callable[[str, Any], Any]
# librdkafka consumer property -> (Faust setting, conversion). Faust's timeouts are seconds.
_CONSUMER: dict[str, tuple[str, _Convert]] = {
    "session.timeout.ms": ("broker_session_timeout", _seconds),
    "heartbeat.interval.ms": ("broker_heartbeat_interval", _seconds),
    "max.poll.interval.ms": ("broker_max_poll_interval", _seconds),
    "auto.offset.reset": ("consumer_auto_offset_reset", _lower),
    "group.instance.id": ("consumer_group_instance_id", _as_is),
    "max.partition.fetch.bytes": ("consumer_max_fetch_size", _int),
    "check.crcs": ("broker_check_crcs", lambda k, v: str(v).lower() in ("true", "1")),
    "metadata.max.age.ms": ("consumer_metadata_max_age_ms", _int),
    "connections.max.idle.ms": ("consumer_connections_max_idle_ms", _int),
}
_PRODUCER: dict[str, tuple[str, _Convert]] = {
    "acks": ("producer_acks", _acks),
    "request.required.acks": ("producer_acks", _acks),  # librdkafka's alias
    "linger.ms": ("producer_linger", _seconds),
    "queue.buffering.max.ms": ("producer_linger", _seconds),  # alias of linger.ms
    "compression.type": ("producer_compression_type", _lower),
    "compression.codec": ("producer_compression_type", _lower),  # alias
    "batch.size": ("producer_max_batch_size", _int),
    "message.max.bytes": ("producer_max_request_size", _int),
    "request.timeout.ms": ("producer_request_timeout", _seconds),
    "metadata.max.age.ms": ("producer_metadata_max_age_ms", _int),
    "connections.max.idle.ms": ("producer_connections_max_idle_ms", _int),
}
_HONOURED = ", ".join(sorted(_SHARED | set(_CONSUMER) | set(_PRODUCER)))


def _refuse(key: str, why: str = "") -> UserError:
    return UserError(f"Kafka setting {key} is not supported by the Faust app (aiokafka){why}")


def faust_kafka_settings(kafka: KafkaBlock, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``faust.App`` keyword settings for the `kafka:` block; UserError (one line, naming
    the key, never a secret's value) for the first setting Faust cannot honour."""
    roles = {role: settings_for(kafka, role, environ) for role in ROLES}
    shared = _shared(roles)
    for key in kafka.admin:  # Faust's topic creation rides on the producer's connection
        if key not in _SHARED and roles["admin"][key] != roles["producer"].get(key):
            raise UserError(
                f"Kafka setting {key} in kafka.admin is not supported by the Faust app: it has no admin "
                "client (it creates topics with its producer's connection); set it in kafka.producer"
            )
    out = _credentials(shared)
    if "client.id" in shared:
        out["broker_client_id"] = str(shared["client.id"])
    for role, table, other in (("consumer", _CONSUMER, _PRODUCER), ("producer", _PRODUCER, _CONSUMER)):
        for key, value in roles[role].items():
            if key in table:
                name, convert = table[key]
                out[name] = convert(key, value)
            elif key not in _SHARED and key not in other:
                raise _refuse(key, f"; it honours {_HONOURED}")
    return out


def _shared(roles: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The security settings and client.id, which must agree across the roles."""
    out: dict[str, Any] = {}
    for key in sorted({k for s in roles.values() for k in s if k in _SHARED}):
        values = [s.get(key) for s in roles.values()]
        if any(v != values[0] for v in values):
            raise UserError(
                f"Kafka setting {key} differs between kafka.consumer, kafka.producer and kafka.admin: "
                "the Faust app uses one value for all its clients; set it in kafka.common"
            )
        out[key] = values[0]
    return out


def _credentials(s: Mapping[str, Any]) -> dict[str, Any]:
    """``broker_credentials`` for the security settings: SASLCredentials (PLAIN,
    SCRAM-SHA-256/512), GSSAPICredentials or SSLCredentials, or nothing (PLAINTEXT)."""
    import faust

    protocol = str(s.get("security.protocol", "PLAINTEXT")).upper()
    if protocol not in _PROTOCOLS:
        raise _refuse("security.protocol", f": {protocol!r} is not one of {', '.join(_PROTOCOLS)}")
    uses_ssl, uses_sasl = "SSL" in protocol, protocol.startswith("SASL")
    # librdkafka ignores these without TLS/SASL; refusing catches a forgotten protocol,
    # which would otherwise connect in plain text.
    for key in sorted(s):
        if key in _SSL_KEYS and not uses_ssl:
            raise UserError(f"Kafka setting {key} needs security.protocol SSL or SASL_SSL (it is {protocol})")
        if key in _SASL_KEYS and not uses_sasl:
            raise UserError(
                f"Kafka setting {key} needs security.protocol SASL_PLAINTEXT or SASL_SSL (it is {protocol})"
            )
    context = ssl_context(s) if uses_ssl else None
    if not uses_sasl:
        return {"broker_credentials": faust.SSLCredentials(context)} if context else {}
    # Both names are librdkafka's; GSSAPI is its default mechanism.
    mech_key = "sasl.mechanism" if "sasl.mechanism" in s else "sasl.mechanisms"
    mechanism = str(s.get(mech_key, "GSSAPI")).upper()
    if mechanism == "GSSAPI":
        for key in ("sasl.username", "sasl.password"):
            if key in s:
                raise _refuse(key, " with sasl.mechanism GSSAPI")
        return {"broker_credentials": faust.GSSAPICredentials(
            kerberos_service_name=str(s.get("sasl.kerberos.service.name", "kafka")), ssl_context=context,
        )}
    if mechanism not in _USER_MECHANISMS:
        raise _refuse(mech_key, f": {mechanism} (it honours GSSAPI, {', '.join(_USER_MECHANISMS)})")
    if "sasl.kerberos.service.name" in s:
        raise _refuse("sasl.kerberos.service.name", f" with sasl.mechanism {mechanism}")
    for key in ("sasl.username", "sasl.password"):
        if key not in s:
            raise UserError(f"Kafka setting {key} is missing: sasl.mechanism {mechanism} needs it")
    # SASLCredentials is SASL_SSL exactly when it has a context, SASL_PLAINTEXT otherwise.
    return {"broker_credentials": faust.SASLCredentials(
        username=str(s["sasl.username"]), password=str(s["sasl.password"]),
        mechanism=mechanism, ssl_context=context,
    )}


def ssl_context(s: Mapping[str, Any]) -> ssl.SSLContext:
    """A client TLS context for librdkafka's ssl.* settings (system CAs unless
    ssl.ca.location / ssl.ca.pem; hostname checked unless switched off, as librdkafka)."""
    from aiokafka.helpers import create_ssl_context

    ca = str(s.get("ssl.ca.location", "probe"))  # librdkafka's "probe": the system's CAs
    ca_path = None if ca == "probe" else _path("ssl.ca.location", ca)
    cert = s.get("ssl.certificate.location")
    key = s.get("ssl.key.location")
    if key is not None and cert is None:
        raise UserError("Kafka setting ssl.key.location needs ssl.certificate.location")
    try:
        context = create_ssl_context(
            cafile=ca_path if ca_path and not os.path.isdir(ca_path) else None,
            capath=ca_path if ca_path and os.path.isdir(ca_path) else None,
            cadata=s.get("ssl.ca.pem"),
            certfile=_path("ssl.certificate.location", cert) if cert is not None else None,
            keyfile=_path("ssl.key.location", key) if key is not None else None,
            password=s.get("ssl.key.password"),
        )
    except ssl.SSLError as exc:  # names the library's reason, never the key password
        raise UserError(f"Kafka TLS settings (ssl.*): {exc.reason or exc.__class__.__name__}") from None
    algorithm = str(s.get("ssl.endpoint.identification.algorithm", "https")).lower()
    if algorithm not in ("https", "none"):
        raise _refuse("ssl.endpoint.identification.algorithm", f": {algorithm!r} is not https or none")
    verify = str(s.get("enable.ssl.certificate.verification", "true")).lower() not in ("false", "0")
    context.check_hostname = verify and algorithm == "https"
    if not verify:
        context.verify_mode = ssl.CERT_NONE
    return context


def _path(key: str, value: Any) -> str:
    path = Path(str(value))
    if not path.exists():
        raise UserError(f"Kafka setting {key}: {path} does not exist")
    return str(path)


def describe(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` fit for a log line: credentials by kind and mechanism, no secret (nor
    the user name, which librdkafka counts as sensitive: consumers/client_settings.py)."""
    out = {k: (REDACTED if is_secret(k) else v) for k, v in settings.items() if k != "broker_credentials"}
    creds = settings.get("broker_credentials")
    if creds is not None:
        kind = type(creds).__name__
        mech = getattr(getattr(creds, "mechanism", None), "value", None)
        user = getattr(creds, "username", None)
        out["broker_credentials"] = kind + (f"({mech}, user {REDACTED})" if user else f"({mech})" if mech else "")
    return out


KAFKA_ENV_PREFIX = "TIDEBATCH_KAFKA__"


def load_kafka_block(
    config_path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> KafkaOverrides:
    """The `kafka:` block from the worker's own sources: a worker config file's
    `kafka:` section, then TIDEBATCH_KAFKA__<BLOCK>__<KEY> variables on top (read
    exactly as `tidebatch run` reads them). Other TIDEBATCH_* variables are the
    worker's and are not looked at; the file is validated as a worker config."""
    from pipeline.config import load_config

    env = os.environ if environ is None else environ
    kafka_env = {k: v for k, v in env.items() if k.startswith(KAFKA_ENV_PREFIX)}
    return load_config(config_path, environ=kafka_env).kafka
