"""The `kafka:` block's settings for one client, with secrets resolved and redacted.

Every confluent-kafka client the project makes takes its user settings from
`settings_for(kafka, role)`: `kafka.common` first, then the role's own block
(`consumer`, `producer` or `admin`), so one SASL/TLS block covers the worker, the admin
client, the reachability check, `produce` and `etl --topic`. Names are librdkafka's.

A secret (sasl.password and any key naming a password or secret) may be written as
`${ENV_VAR}` or `@file:/path`, so it need not sit in a YAML file or a shell history.
Its value never appears in anything the project prints: `redacted()` is what logs show.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pipeline.errors import UserError

ROLES: tuple[str, ...] = ("consumer", "producer", "admin")
REDACTED = "***"
_SECRET_KEYS = frozenset({
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
})
_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_FILE_REF = "@file:"


class KafkaBlock(Protocol):
    """The `kafka:` section (pipeline/config.py KafkaOverrides)."""

    common: dict[str, Any]
    consumer: dict[str, Any]
    producer: dict[str, Any]
    admin: dict[str, Any]


def is_secret(key: str) -> bool:
    """True for settings whose value must never be shown."""
    name = str(key).lower()
    return name in _SECRET_KEYS or "password" in name or "secret" in name


def settings_for(
    kafka: KafkaBlock, role: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`kafka.common` < `kafka.<role>`, secrets resolved: what a client of `role` gets."""
    if role not in ROLES:
        raise ValueError(f"unknown Kafka client role {role!r}")
    merged = {**kafka.common, **getattr(kafka, role)}
    env = os.environ if environ is None else environ
    return {k: resolve_secret(k, v, env) if is_secret(k) else v for k, v in merged.items()}


def resolve_secret(key: str, value: Any, environ: Mapping[str, str], what: str = "Kafka setting") -> str:
    """`${VAR}` from the environment, `@file:/path` from the file (stripped), else the
    value itself. Errors name the key (`what` says whose) and where it was looked for,
    never a value."""
    text = str(value)
    ref = _ENV_REF.match(text)
    if ref:
        if ref.group(1) not in environ:
            raise UserError(f"{what} {key}: environment variable {ref.group(1)} is not set")
        return environ[ref.group(1)]
    if text.startswith(_FILE_REF):
        path = Path(text[len(_FILE_REF):])
        try:
            return path.read_text().strip()
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
