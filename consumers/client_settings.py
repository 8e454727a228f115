"""The `kafka:` block's settings for one client, with secrets resolved and redacted.

Every confluent-kafka client the project makes takes its user settings from
`settings_for(kafka, role)`: `kafka.common` first, then the role's own block
(`consumer`, `producer` or `admin`), so one SASL/TLS block covers the worker, the admin
client, the reachability check, `produce` and `etl --topic`. Names are librdkafka's.

A secret (every key librdkafka marks sensitive, its kafka-python and Java/Faust names,
and any key naming a password or secret: `is_secret`) may be written as
`${ENV_VAR}` or `@file:/path`, so it need not sit in a YAML file or a shell history; a
client's private key may so be read from a file into `ssl.key.pem`. Its value never
appears in anything the project prints: `redacted()` is what a dump of settings shows,
and every value resolved here is registered with consumers/secret_values.py, whose
`scrub` masks it in every log line and error, whoever wrote the text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from consumers.secret_values import SECRETS
from pipeline.errors import UserError

ROLES: tuple[str, ...] = ("consumer", "producer", "admin")
REDACTED = "***"
# librdkafka's properties marked _RK_SENSITIVE (its rdkafka_conf.c; its configuration doc shows
# them as such), with the ones it added for OAUTHBEARER assertions, then the same
# settings under kafka-python's and the Java client's (Faust's, aiokafka's) names.
_SECRET_KEYS = frozenset({
    "sasl.username", "sasl.password", "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.pem", "sasl.oauthbearer.assertion.private.key.passphrase",
    "ssl.ca.pem", "ssl.certificate.pem", "ssl_key",
    "sasl.jaas.config", "sasl_plain_username", "sasl_plain_password", "ssl_password",
    "sasl_oauth_token_provider", "broker_credentials",
})
# Whole families: every `*.password` and `*.pem`, every `ssl.key.*` (the key itself,
# its file, its passphrase) and `ssl.keystore.*`.
_SECRET_PREFIXES = ("ssl.key.", "ssl.keystore.")
_SECRET_SUFFIXES = (".password", ".pem", ".passphrase")
# Not "token": sasl.oauthbearer.token.endpoint.url is an address, not a secret.
_SECRET_WORDS = ("password", "secret")
# Identities and paths are redacted from dumps but not masked in free text: a user name
# such as "tidebatch" or a path is the kind of word every other line may hold, and an
# error naming the path of an unreadable key file is what an operator needs.
_NOT_MASKED = frozenset({"sasl.username", "sasl_plain_username"})
_PATH_SUFFIXES = (".location",)
_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_FILE_REF = "@file:"


class KafkaBlock(Protocol):
    """The `kafka:` section (pipeline/config/sections.py KafkaOverrides)."""

    common: dict[str, Any]
    consumer: dict[str, Any]
    producer: dict[str, Any]
    admin: dict[str, Any]


def is_secret(key: str) -> bool:
    """True for settings whose value must never be shown."""
    name = str(key).lower()
    return (
        name in _SECRET_KEYS
        or name.startswith(_SECRET_PREFIXES)
        or name.endswith(_SECRET_SUFFIXES)
        or any(word in name for word in _SECRET_WORDS)
    )


def masked_in_text(key: str) -> bool:
    """True for secrets whose value is masked wherever it appears in printed text
    (consumers/secret_values.py), not only where it is printed under its key."""
    name = str(key).lower()
    return is_secret(name) and name not in _NOT_MASKED and not name.endswith(_PATH_SUFFIXES)


def settings_for(
    kafka: KafkaBlock, role: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`kafka.common` < `kafka.<role>`, secrets resolved: what a client of `role` gets."""
    if role not in ROLES:
        raise ValueError(f"unknown Kafka client role {role!r}")
    merged = {**kafka.common, **getattr(kafka, role)}
    env = os.environ if environ is None else environ
    return {k: resolve_secret(k, v, env) if is_secret(k) else v for k, v in merged.items()}


def is_reference(value: object) -> bool:
    """True for `${ENV_VAR}` and `@file:/path`, the forms resolve_secret reads; any other
    value is the secret itself."""
    text = str(value)
    return bool(_ENV_REF.match(text)) or text.startswith(_FILE_REF)


def resolve_secret(key: str, value: Any, environ: Mapping[str, str], what: str = "Kafka setting") -> str:
    """`${VAR}` from the environment, `@file:/path` from the file (stripped), else the
    value itself. Errors name the key (`what` says whose) and where it was looked for,
    never a value. The value is registered with consumers/secret_values.py, so no
    printed line shows it from then on."""
    text = _resolved(key, str(value), environ, what)
    if masked_in_text(key):
        SECRETS.register(text)
    return text


def _resolved(key: str, text: str, environ: Mapping[str, str], what: str) -> str:
    ref = _ENV_REF.match(text)
    if ref:
        if ref.group(1) not in environ:
            raise UserError(f"{what} {key}: environment variable {ref.group(1)} is not set")
        return environ[ref.group(1)]
    if text.startswith(_FILE_REF):
        path = Path(text[len(_FILE_REF):])
        try:
            # A PEM key keeps its last newline; a password file's is not part of it.
            body = path.read_text()
            return body if key.lower().endswith(".pem") else body.strip()
        except OSError as exc:
            raise UserError(f"{what} {key}: cannot read {path}: {exc.strerror}") from None
    return text


def redacted(config: Mapping[str, Any], also: Collection[str] = ()) -> dict[str, Any]:
    """`config` with every secret's value replaced, for logs and dumps; `also` names
    more secret keys (a bearer token's name says neither password nor secret)."""
    return {k: REDACTED if is_secret(k) or k in also else v for k, v in config.items()}


def parse_x(items: Iterable[str] | None) -> dict[str, str]:
    """kcat's `-X key=value` (repeatable) → settings for `kafka.common`."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep:  # no value given, so nothing secret to leak
            raise UserError(f"-X {item}: expected key=value")
        if not key.strip():  # only say so: the value may be a secret
            raise UserError("-X: expected key=value, got no key")
        out[key.strip()] = value
    return out


def env_key(name: str) -> str:
    """A `kafka.<role>` key from an environment variable name: librdkafka names use
    dots, which a shell cannot export, so TIDEBATCH_KAFKA__COMMON__SASL_PASSWORD means
    sasl.password (only librdkafka's callbacks, which no string sets, have underscores)."""
    return name.replace("_", ".")
