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
# One broker refuses while others answer (or may): a warning naming it, never
# "unreachable" (consumers/broker_states.py decides which of the two a refusal is).
BROKER_DOWN = "broker_down"
AUTHENTICATION = "authentication"
TLS = "tls"
# The broker's certificate is trusted but names another host than the one connected
# to: told apart from an untrusted CA, whose fix is another ssl.ca.location.
TLS_HOSTNAME = "tls_hostname"
TOPIC_AUTHORIZATION = "topic_authorization"
GROUP_AUTHORIZATION = "group_authorization"

# Failures that retrying cannot fix and that a client meets before it gets in: a
# wrong password or an untrusted certificate. Each retry is one more failed login on
# the broker (and may lock the account), so the process stops at the first one.
FATAL_AT_START: frozenset[str] = frozenset({AUTHENTICATION, TLS, TLS_HOSTNAME})

# librdkafka error names (KafkaError.name()) per failure. _TRANSPORT is also a broker
# dropping an established connection, so it counts as "unreachable" only together
# with "nothing ever answered" (the caller's job, not this module's). _TRANSPORT is
# also what librdkafka 2.x reports for some failed TLS handshakes ("error:0A000086:SSL
# routines::certificate verify failed (after 15ms in state SSL_HANDSHAKE)"), so its
# text is read first (_GENERIC_CODES).
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

_GENERIC_CODES = frozenset({"_TRANSPORT"})

# Log lines carry no code: the same failures recognised by their text (librdkafka
# 2.x wording: rdkafka_broker.c, rdkafka_sasl*.c, rdkafka_ssl.c), read without the
# broker's name in front ("sasl_ssl://host:port/bootstrap: ": its "sasl" and
# "failed" further on made a refused connection read as a failed login). Order
# matters: a TLS failure's text also says "Connect to ... failed" in some versions,
# and a hostname mismatch is also a failed certificate verification. librdkafka 2.16
# itself words a hostname mismatch exactly like an untrusted CA (measured, see
# consumers/kafka_reachable.py); these texts are OpenSSL's and Python's
# (X509_V_ERR_HOSTNAME_MISMATCH 62, X509_V_ERR_IP_ADDRESS_MISMATCH 64).
_HOSTNAME = re.compile(
    r"hostname mismatch|hostname verification failed|IP address mismatch|"
    r"certificate is not valid for|verify (?:error|result):?\s*(?:num=)?6[24]\b",
    re.I,
)
_TEXTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_HOSTNAME, TLS_HOSTNAME),
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
# The broker's name in front of its messages: "sasl_ssl://127.0.0.1:9093/bootstrap: ",
# "127.0.0.1:9093/2: " (a broker learned from metadata: its node id).
_BROKER_NAME = re.compile(r"^(?:[a-z_]+://)?(?P<address>\[[^\]]+\]:\d+|[^\s/\[\]]+:\d+)/\w+:\s*", re.I)
# Where a connection was attempted, for messages not led by a broker's name, e.g. the
# group coordinator's: "GroupCoordinator: 127.0.0.1:9092: Connect to ipv4#127.0.0.1:9092
# failed: Connection refused" (measured, tests/integration/test_cluster_faults.py).
_CONNECT_TO = re.compile(r"Connect to ipv[46]#\[?(?P<host>[^\s\]]+?)\]?:(?P<port>\d+) failed")
# "... failed: Connection refused (after 0ms in state CONNECT)": the reason, in short.
_REASON = re.compile(r"failed:\s*(?P<reason>.*?)\s*(?:\(after \d+ms in state \w+\))?$")


# Refusals that reach a client which is already in: its principal lacks an ACL. The
# broker will refuse every retry the same way until an operator changes the ACLs.
REFUSED_ACCESS: frozenset[str] = frozenset({TOPIC_AUTHORIZATION, GROUP_AUTHORIZATION})


@dataclass(frozen=True)
class KafkaFailure:
    kind: str  # one of the constants above
    line: str  # what the operator reads: what is wrong, where, and librdkafka's words
    broker: str | None = None  # host:port of the broker it names, when it names one

    @property
    def fatal_at_start(self) -> bool:
        return self.kind in FATAL_AT_START


def detail(message: str) -> str:
    """librdkafka's text without its thread prefix."""
    return _THREAD_PREFIX.sub("", message.strip())


def broker_of(message: str) -> str | None:
    """host:port of the broker a librdkafka message is about, if it names one."""
    text = detail(message)
    match = _BROKER_NAME.match(text)
    if match:
        return match.group("address")
    connect = _CONNECT_TO.search(text)
    if connect is None:
        return None
    host = connect.group("host")
    return f"[{host}]:{connect.group('port')}" if ":" in host else f"{host}:{connect.group('port')}"


def _words(message: str) -> str:
    """librdkafka's own words: without the thread prefix and the broker's name."""
    return _BROKER_NAME.sub("", detail(message), count=1)


def reason(message: str) -> str:
    """What went wrong, in short: "Connection refused" from "Connect to ipv4#... failed:
    Connection refused (after 0ms in state CONNECT)"."""
    words = _words(message)
    match = _REASON.search(words)
    return match.group("reason") if match and match.group("reason") else words


def kind_of(code_name: str | None, message: str) -> str | None:
    """Which failure a librdkafka error (its code's name) or log text is, if any."""
    words = _words(message)
    if code_name == "_TRANSPORT" and _TLS_ALERT.search(message):
        return TLS
    if code_name and code_name in _CODES and code_name not in _GENERIC_CODES:
        if _CODES[code_name] == TLS and _HOSTNAME.search(words):
            return TLS_HOSTNAME  # _SSL says "TLS"; its text may say which check failed
        return _CODES[code_name]
    for pattern, kind in _TEXTS:
        if pattern.search(words):
            return kind
    return _CODES.get(code_name or "")


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
    if kind == TLS_HOSTNAME:
        return (
            f"TLS handshake with Kafka at {bootstrap} failed: the broker's certificate does not name "
            f"the host connected to: {why} (hostname mismatch: check the bootstrap address against "
            "the certificate's SAN, or ssl.endpoint.identification.algorithm)"
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


def broker_down_line(broker: str, bootstrap: str, message: str, others_answer: bool) -> str:
    """The warning for one broker refusing while the others answer (or have not failed)."""
    others = "the others answer" if others_answer else "no other broker has failed"
    return f"Kafka broker {broker} (of {bootstrap}) is not answering: {reason(message)}; {others}"


def classify(code_name: str | None, message: str, bootstrap: str) -> KafkaFailure | None:
    """The failure a librdkafka error or log line reports, with its one line; None for
    everything else (those are logged as librdkafka wrote them)."""
    kind = kind_of(code_name, message)
    if kind is None:
        return None
    return KafkaFailure(kind, failure_line(kind, bootstrap, message), broker_of(message))
