"""The common Kafka failures are told apart from librdkafka's error codes and log
texts (the wording of librdkafka 2.x), each as one line naming the address."""

from __future__ import annotations

import pytest

from consumers.kafka_failures import (
    AUTHENTICATION,
    GROUP_AUTHORIZATION,
    TLS,
    TLS_HOSTNAME,
    TOPIC_AUTHORIZATION,
    UNREACHABLE,
    broker_down_line,
    broker_of,
    classify,
    detail,
    kind_of,
    reason,
)

ADDR = "kafka.example:9093"

# (code name or None for a log line, librdkafka's text, the failure it is)
CASES = [
    ("_ALL_BROKERS_DOWN", "1/1 brokers are down", UNREACHABLE),
    (
        "_TRANSPORT",
        "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)",
        UNREACHABLE,
    ),
    ("_RESOLVE", "nohost:9092/bootstrap: Failed to resolve 'nohost:9092': Name or service not known", UNREACHABLE),
    (
        None,
        "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
        "Connection refused (after 0ms in state CONNECT)",
        UNREACHABLE,
    ),
    (
        "_AUTHENTICATION",
        "sasl_ssl://kafka.example:9093/bootstrap: SASL authentication error: Authentication failed during "
        "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 312ms in state AUTH_REQ)",
        AUTHENTICATION,
    ),
    (
        None,
        "[thrd:sasl_ssl://kafka.example:9093/bootstrap]: sasl_ssl://kafka.example:9093/bootstrap: SASL "
        "authentication error: Authentication failed during authentication due to invalid credentials",
        AUTHENTICATION,
    ),
    ("SASL_AUTHENTICATION_FAILED", "Broker: SASL Authentication failed", AUTHENTICATION),
    (
        "_SSL",
        "ssl://kafka.example:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate "
        "verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly "
        "configured (after 5ms in state SSL_HANDSHAKE)",
        TLS,
    ),
    (
        None,
        "[thrd:ssl://kafka.example:9093/bootstrap]: ssl://kafka.example:9093/bootstrap: SSL handshake failed: "
        "Disconnected: connecting to a PLAINTEXT broker listener? (after 2ms in state SSL_HANDSHAKE)",
        TLS,
    ),
    (
        # The broker refused the client's certificate (mTLS): a TLS alert, which
        # librdkafka reports as _TRANSPORT once its side of the handshake was done.
        "_TRANSPORT",
        "ssl://kafka.example:9093/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert bad "
        "certificate: SSL alert number 42 (after 0ms in state APIVERSION_QUERY)",
        TLS,
    ),
    ("TOPIC_AUTHORIZATION_FAILED", "Subscribed topic not available: ctr.requests: Broker: Topic authorization failed",
     TOPIC_AUTHORIZATION),
    (None, "Fetch from broker 1 failed: Broker: Topic authorization failed", TOPIC_AUTHORIZATION),
    ("GROUP_AUTHORIZATION_FAILED", "JoinGroup failed: Broker: Group authorization failed", GROUP_AUTHORIZATION),
]


@pytest.mark.parametrize(("code", "text", "kind"), CASES)
def test_each_common_failure_is_recognised(code: str | None, text: str, kind: str) -> None:
    failure = classify(code, text, ADDR)
    assert failure is not None and failure.kind == kind
    assert ADDR in failure.line and "\n" not in failure.line
    assert "[thrd:" not in failure.line  # librdkafka's thread prefix is noise to a reader


@pytest.mark.parametrize(
    "text",
    [
        "Configuration property fetch.wait.max.ms is a consumer property and will be ignored by this producer",
        "Broker: Not coordinator",
        "Subscribed topic not available: ctr.requests: Broker: Unknown topic or partition",
        "Timed out MetadataRequest in flight (after 60004ms, timeout #0)",
    ],
)
def test_other_lines_are_not_classified(text: str) -> None:
    assert classify(None, text, ADDR) is None


def test_a_code_wins_over_the_text() -> None:
    # A group error whose text mentions a connection is still a group error.
    assert kind_of("GROUP_AUTHORIZATION_FAILED", "Connect to x failed") == GROUP_AUTHORIZATION


def test_only_auth_and_tls_stop_a_client_at_once() -> None:
    fatal = {kind for code, text, kind in CASES if classify(code, text, ADDR).fatal_at_start}  # type: ignore[union-attr]
    assert fatal == {AUTHENTICATION, TLS}


def test_lines_say_what_to_check() -> None:
    auth = classify("_AUTHENTICATION", "SASL authentication error", ADDR)
    tls = classify("_SSL", "SSL handshake failed", ADDR)
    unreachable = classify("_TRANSPORT", "Connection refused", ADDR)
    assert auth is not None and "sasl.password" in auth.line
    assert tls is not None and "ssl.ca.location" in tls.line
    assert unreachable is not None and unreachable.line.startswith(f"Kafka broker unreachable at {ADDR}")


def test_detail_drops_the_thread_prefix() -> None:
    assert detail("[thrd:a:1/bootstrap]: a:1/bootstrap: down") == "a:1/bootstrap: down"


def test_a_produce_refused_for_a_missing_acl_is_forbidden_not_retriable() -> None:
    # consumers/confluent_backend.py: what the worker's producer reports for a record.
    from confluent_kafka import KafkaError

    from consumers.confluent_backend import _send_error

    err = _send_error(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"), "out", ADDR)
    assert err.forbidden and not err.refused
    assert err.reason.startswith(f"Kafka topic authorization failed at {ADDR}: writing to out:")
    timeout = _send_error(KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"), "out", ADDR)
    assert not timeout.forbidden and not timeout.refused


def test_a_refused_client_certificate_says_to_check_the_client_certificate() -> None:
    refused = classify("_TRANSPORT", "Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate", ADDR)
    assert refused is not None and "ssl.certificate.location" in refused.line
    untrusted = classify("_SSL", "SSL handshake failed: certificate verify failed", ADDR)
    assert untrusted is not None and "ssl.certificate.location" not in untrusted.line
    dropped = classify("_TRANSPORT", "ssl://kafka.example:9093/1: Disconnected (after 5012ms in state UP)", ADDR)
    assert dropped is not None and dropped.kind == UNREACHABLE


# librdkafka 2.16's own words, measured (issue 44): a SASL_SSL client whose broker does
# not listen. Its "sasl_ssl://" name and "failed" made it read as a failed login.
SASL_SSL_REFUSED = (
    "[thrd:sasl_ssl://127.0.0.1:38521/bootstrap]: sasl_ssl://127.0.0.1:38521/bootstrap: Connect to "
    "ipv4#127.0.0.1:38521 failed: Connection refused (after 0ms in state CONNECT)"
)


@pytest.mark.parametrize("code", [None, "_TRANSPORT"])
def test_a_refused_connection_over_sasl_ssl_is_unreachable_not_authentication(code: str | None) -> None:
    failure = classify(code, detail(SASL_SSL_REFUSED) if code else SASL_SSL_REFUSED, ADDR)
    assert failure is not None and failure.kind == UNREACHABLE, failure
    assert failure.broker == "127.0.0.1:38521"


def test_a_failed_certificate_check_reported_as_transport_is_tls() -> None:
    # What librdkafka 2.16 says between the "SSL handshake failed" lines (measured).
    text = "sasl_ssl://127.0.0.1:55005/bootstrap: error:0A000086:SSL routines::certificate verify failed " \
           "(after 15ms in state SSL_HANDSHAKE)"
    assert kind_of("_TRANSPORT", text) == TLS


@pytest.mark.parametrize(
    "text",
    [
        # OpenSSL's verify errors 62 and 64, as Python's ssl and kafka-python word them
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not "
        "valid for 'kafka.example'. (_ssl.c:1000)",
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not "
        "valid for '127.0.0.1'. (_ssl.c:1000)",
        "ssl://kafka.example:9093/bootstrap: SSL handshake failed: hostname verification failed",
        "verify error:num=62:hostname mismatch",
    ],
)
def test_a_hostname_mismatch_is_its_own_failure(text: str) -> None:
    failure = classify("_SSL", text, ADDR)
    assert failure is not None and failure.kind == TLS_HOSTNAME and failure.fatal_at_start
    assert "does not name the host" in failure.line and "SAN" in failure.line
    assert "ssl.endpoint.identification.algorithm" in failure.line


def test_an_untrusted_ca_is_not_a_hostname_mismatch() -> None:
    untrusted = classify("_SSL", CASES[7][1], ADDR)
    assert untrusted is not None and untrusted.kind == TLS


def test_broker_and_reason_are_read_from_librdkafkas_words() -> None:
    assert broker_of(SASL_SSL_REFUSED) == "127.0.0.1:38521"
    assert broker_of("127.0.0.1:9093/2: Connect to ipv4#127.0.0.1:9093 failed: x") == "127.0.0.1:9093"
    assert broker_of("1/1 brokers are down") is None
    assert reason(SASL_SSL_REFUSED) == "Connection refused"


def test_the_broker_down_line_names_the_broker_among_the_others() -> None:
    line = broker_down_line("B:2", "A:1,B:2,C:3", "B:2/2: Connect to ipv4#B:2 failed: Connection refused "
                            "(after 0ms in state CONNECT)", others_answer=True)
    assert line == "Kafka broker B:2 (of A:1,B:2,C:3) is not answering: Connection refused; the others answer"


def test_the_group_coordinators_refusal_names_its_broker() -> None:
    # Measured: a worker whose coordinator's node was killed (test_cluster_faults.py).
    text = ("GroupCoordinator: 127.0.0.1:59047: Connect to ipv4#127.0.0.1:59047 failed: Connection refused "
            "(after 0ms in state CONNECT)")
    failure = classify("_TRANSPORT", text, ADDR)
    assert failure is not None and failure.kind == UNREACHABLE and failure.broker == "127.0.0.1:59047"
    assert reason(text) == "Connection refused"
    assert broker_of("[::1]:9092/bootstrap: Connect to ipv6#[::1]:9092 failed: x") == "[::1]:9092"
    assert broker_of("x: Connect to ipv6#[::1]:9092 failed: Connection refused") == "[::1]:9092"
