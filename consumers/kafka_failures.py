"""The Kafka failures an operator must recognise at a glance, told apart from
librdkafka's error codes and log texts, each turned into one clear line.

Pure: no client, no clock. consumers/client_logs.py calls `classify` for every
librdkafka log line and error event; consumers/kafka_reachable.py uses the verdicts to
decide when a client that cannot get in should give up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNREACHABLE = "unreachable"
AUTHENTICATION = "authentication"
TLS = "tls"
TOPIC_AUTHORIZATION = "topic_authorization"
GROUP_AUTHORIZATION = "group_authorization"

# Failures that retrying cannot fix and that a client meets before it gets in: a
# wrong password or an untrusted certificate. Each retry is one more failed login on
# the broker (and may lock the account), so the process stops at the first one.
FATAL_AT_START: frozenset[str] = frozenset({AUTHENTICATION, TLS})

# librdkafka error names (KafkaError.name()) per failure. _TRANSPORT is also a broker
# dropping an established connection, so it counts as "unreachable" only together
# with "nothing ever answered" (the caller's job, not this module's).
_CODES: dict[str, str] = {
    "_ALL_BROKERS_DOWN": UNREACHABLE,
    "_TRANSPORT": UNREACHABLE,
    "_RESOLVE": UNREACHABLE,
    "_AUTHENTICATION": AUTHENTICATION,
    "SASL_AUTHENTICATION_FAILED": AUTHENTICATION,
    "UNSUPPORTED_SASL_MECHANISM": AUTHENTICATION,
    "ILLEGAL_SASL_STATE": AUTHENTICATION,
    "_SSL": TLS,
    "TOPIC_AUTHORIZATION_FAILED": TOPIC_AUTHORIZATION,
    "GROUP_AUTHORIZATION_FAILED": GROUP_AUTHORIZATION,
}

# Log lines carry no code: the same failures recognised by their text (librdkafka
# 2.x wording: rdkafka_broker.c, rdkafka_sasl*.c, rdkafka_ssl.c). Order matters: a
# TLS failure's text also says "Connect to ... failed" in some versions.
_TEXTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"SSL handshake failed|certificate verify failed|ssl\.ca\.location|\bSSL_\w+|\bTLS\b", re.I), TLS),
    (re.compile(r"SASL authentication|Authentication failed|SASL.*fail|invalid credentials", re.I), AUTHENTICATION),
    (re.compile(r"topic authorization failed", re.I), TOPIC_AUTHORIZATION),
    (re.compile(r"group authorization failed", re.I), GROUP_AUTHORIZATION),
    (
        re.compile(
            r"Connect to .* failed|Connection refused|Failed to resolve|brokers are down|"
            r"No route to host|Network is unreachable|timed out in state CONNECT",
            re.I,
        ),
        UNREACHABLE,
    ),
)

# A TLS alert the broker sent (it refused the client's certificate: mTLS) arrives as
# _TRANSPORT once the client's side of the handshake is done; OpenSSL's text tells it
# from a dropped connection. Seen with Apache Kafka 4.0 and librdkafka 2.x
# (tests/integration/test_kafka_mtls_oauth.py).
_TLS_ALERT = re.compile(r"SSL routines|ssl/tls alert", re.I)
_CLIENT_CERTIFICATE_REFUSED = re.compile(r"alert (bad|unknown|certificate)", re.I)

# "[thrd:127.0.0.1:9092/bootstrap]: " in front of every broker-thread log line.
_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]:\s*")


# Refusals that reach a client which is already in: its principal lacks an ACL. The
# broker will refuse every retry the same way until an operator changes the ACLs.
REFUSED_ACCESS: frozenset[str] = frozenset({TOPIC_AUTHORIZATION, GROUP_AUTHORIZATION})


@dataclass(frozen=True)
class KafkaFailure:
    kind: str  # one of the constants above
    line: str  # what the operator reads: what is wrong, where, and librdkafka's words

    @property
    def fatal_at_start(self) -> bool:
        return self.kind in FATAL_AT_START


def detail(message: str) -> str:
    """librdkafka's text without its thread prefix."""
    return _THREAD_PREFIX.sub("", message.strip())


def kind_of(code_name: str | None, message: str) -> str | None:
    """Which failure a librdkafka error (its code's name) or log text is, if any."""
    if code_name == "_TRANSPORT" and _TLS_ALERT.search(message):
        return TLS
    if code_name and code_name in _CODES:
        return _CODES[code_name]
    for pattern, kind in _TEXTS:
        if pattern.search(message):
            return kind
    return None


def failure_line(kind: str, bootstrap: str, message: str) -> str:
    """The one line for a failure of `kind` talking to `bootstrap`."""
    why = detail(message)
    if kind == UNREACHABLE:
        return f"Kafka broker unreachable at {bootstrap}: no broker answered ({why})"
    if kind == AUTHENTICATION:
        return (
            f"Kafka authentication failed at {bootstrap}: {why} "
            "(check sasl.mechanism, sasl.username and sasl.password)"
        )
    if kind == TLS and _CLIENT_CERTIFICATE_REFUSED.search(why):
        return (
            f"TLS handshake with Kafka at {bootstrap} failed: {why} "
            "(the broker refused the client certificate: check ssl.certificate.location, "
            "ssl.key.location or ssl.key.pem, and that the broker trusts its CA)"
        )
    if kind == TLS:
        return (
            f"TLS handshake with Kafka at {bootstrap} failed: {why} "
            "(check security.protocol, ssl.ca.location and the broker's certificate)"
        )
    if kind == TOPIC_AUTHORIZATION:
        return f"Kafka topic authorization failed at {bootstrap}: {why} (the principal lacks a topic ACL)"
    if kind == GROUP_AUTHORIZATION:
        return f"Kafka group authorization failed at {bootstrap}: {why} (the principal lacks READ on the consumer group)"
    raise ValueError(f"unknown Kafka failure kind {kind!r}")


def classify(code_name: str | None, message: str, bootstrap: str) -> KafkaFailure | None:
    """The failure a librdkafka error or log line reports, with its one line; None for
    everything else (those are logged as librdkafka wrote them)."""
    kind = kind_of(code_name, message)
    if kind is None:
        return None
    return KafkaFailure(kind, failure_line(kind, bootstrap, message))
