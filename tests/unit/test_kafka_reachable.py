"""The start-up check of `tidebatch run`, `produce` and `etl --topic`: go on once a
broker answers, stop at once when it refuses the login or the TLS handshake, stop
after the bound when none answers. A fake admin client and a fake clock: no network,
no sleeps."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers import client_logs
from consumers.kafka_reachable import KafkaUnavailable, connection_settings, require_kafka
from pipeline.clock import FakeClock
from pipeline.errors import UserError

ADDR = "127.0.0.1:1"
REFUSED = f"{ADDR}/bootstrap: Connect to ipv4#{ADDR} failed: Connection refused (after 0ms in state CONNECT)"


@pytest.fixture(autouse=True)
def fresh_kafka_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process-wide KafkaLog per test: its repeat limiter would otherwise hold back
    a line an earlier test logged within the last 10 s."""
    monkeypatch.setattr(client_logs, "_shared", client_logs.KafkaLog())


class FakeAdmin:
    """Answers metadata after `answers_after` seconds (None: never); each poll
    serves the error events librdkafka would have queued meanwhile."""

    def __init__(self, clock: FakeClock, answers_after: float | None, events: list[KafkaError]) -> None:
        self.clock = clock
        self.answers_after = answers_after
        self.events = events
        self.config: dict[str, Any] = {}
        self.attempts = 0

    def __call__(self, config: dict[str, Any]) -> FakeAdmin:
        self.config = config
        return self

    def list_topics(self, timeout: float) -> object:
        self.attempts += 1
        if self.answers_after is not None and self.clock.now() >= self.answers_after:
            return object()
        self.clock.advance(min(timeout, 0.05))  # refused at once, as a dead port does
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Local: Broker transport failure"))

    def poll(self, timeout: float) -> int:
        self.clock.advance(timeout)
        for event in self.events:
            self.config["error_cb"](event)
        return len(self.events)


def check(admin: FakeAdmin, clock: FakeClock, timeout_s: float = 30.0, config: dict | None = None) -> None:
    require_kafka(ADDR, timeout_s, config, clock=clock.now, make_admin=admin)


def test_returns_once_a_broker_answers() -> None:
    clock = FakeClock()
    admin = FakeAdmin(clock, answers_after=3.0, events=[KafkaError(KafkaError._TRANSPORT, REFUSED)])
    check(admin, clock)
    assert 3.0 <= clock.now() < 4.0


def test_unreachable_gives_up_after_the_bound_with_one_line_naming_the_address() -> None:
    clock = FakeClock()
    events = [KafkaError(KafkaError._TRANSPORT, REFUSED), KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")]
    admin = FakeAdmin(clock, answers_after=None, events=events)
    with pytest.raises(KafkaUnavailable) as caught:
        check(admin, clock, timeout_s=30.0)
    assert 30.0 <= clock.now() < 31.0
    line = str(caught.value)
    assert isinstance(caught.value, UserError)  # the CLI prints it as one line, exit 2
    assert line.startswith(f"Kafka broker unreachable at {ADDR}: ")
    assert "Connection refused" in line and line.endswith("gave up after 30 s")
    assert "\n" not in line


def test_without_error_events_the_metadata_error_is_the_reason() -> None:
    clock = FakeClock()
    with pytest.raises(KafkaUnavailable, match=rf"unreachable at {ADDR}.*Broker transport failure.*after 5 s"):
        check(FakeAdmin(clock, answers_after=None, events=[]), clock, timeout_s=5.0)


@pytest.mark.parametrize(
    ("event", "says"),
    [
        (KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed"), "authentication failed"),
        (KafkaError(KafkaError._SSL, "SSL handshake failed: certificate verify failed"), "TLS handshake"),
    ],
)
def test_a_refused_login_or_handshake_stops_at_once(event: KafkaError, says: str) -> None:
    clock = FakeClock()
    admin = FakeAdmin(clock, answers_after=None, events=[event])
    with pytest.raises(KafkaUnavailable, match=says):
        check(admin, clock)
    assert clock.now() < 1.0 and admin.attempts == 1


def test_only_connection_settings_reach_the_check() -> None:
    clock = FakeClock()
    admin = FakeAdmin(clock, answers_after=0.0, events=[])
    check(admin, clock, config={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                "ssl.ca.location": "/ca.pem", "fetch.wait.max.ms": 5, "group.protocol": "consumer"})
    assert admin.config["security.protocol"] == "SASL_SSL" and "fetch.wait.max.ms" not in admin.config
    assert connection_settings(None) == {}


def test_the_switches_that_decide_a_login_reach_the_check() -> None:
    # Without enable.sasl.oauthbearer.unsecure.jwt the check's client had no token and
    # said "broker unreachable" about a broker that was up.
    config = {"sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": "true",
              "enable.ssl.certificate.verification": "false", "enable.auto.commit": "false"}
    assert connection_settings(config) == {k: v for k, v in config.items() if k != "enable.auto.commit"}


def test_a_refused_login_is_said_once_as_the_error(caplog: pytest.LogCaptureFixture) -> None:
    # Before: a WARNING with the line, then the same line as the error: two lines.
    clock = FakeClock()
    event = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed")
    with caplog.at_level(logging.DEBUG), pytest.raises(KafkaUnavailable) as caught:
        check(FakeAdmin(clock, answers_after=None, events=[event]), clock)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert str(caught.value).startswith(f"Kafka authentication failed at {ADDR}")


def test_while_none_answers_one_waiting_line_then_the_error(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    admin = FakeAdmin(clock, answers_after=None, events=[KafkaError(KafkaError._TRANSPORT, REFUSED)])
    with caplog.at_level(logging.DEBUG), pytest.raises(KafkaUnavailable):
        check(admin, clock, timeout_s=10.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"no Kafka broker at {ADDR} answers yet; retrying for up to 10 s"], warnings


UNVERIFIED = (f"sasl_ssl://{ADDR}/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify "
              "failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured")


@pytest.mark.parametrize(("openssl_says", "begins"), [
    ("IP address mismatch, certificate is not valid for '127.0.0.1'.", "the broker's certificate does not name the host"),
    (None, f"sasl_ssl://{ADDR}/bootstrap: SSL handshake failed"),
])
def test_a_failed_certificate_check_is_looked_at_once_more(openssl_says: str | None, begins: str) -> None:
    # librdkafka words a hostname mismatch like an untrusted CA (consumers/tls_check.py).
    clock = FakeClock()
    asked: list[tuple[str, dict]] = []

    def check_hostname(address: str, settings: dict) -> str | None:
        asked.append((address, dict(settings)))
        return openssl_says

    with pytest.raises(KafkaUnavailable) as caught:
        require_kafka(ADDR, 30.0, {"ssl.ca.location": "/ca.pem"}, clock=clock.now,
                      make_admin=FakeAdmin(clock, None, [KafkaError(KafkaError._SSL, UNVERIFIED)]),
                      check_hostname=check_hostname)
    assert str(caught.value).startswith(f"TLS handshake with Kafka at {ADDR} failed: {begins}")
    assert asked == [(ADDR, {"ssl.ca.location": "/ca.pem"})]


def test_the_brokers_that_answered_are_noted_for_later_refusals(caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka.admin import BrokerMetadata

    class Metadata:
        orig_broker_name = "127.0.0.1:9092/bootstrap"
        brokers = {1: BrokerMetadata(), 2: BrokerMetadata()}

    Metadata.brokers[1].host, Metadata.brokers[1].port = "127.0.0.1", 9092
    Metadata.brokers[2].host, Metadata.brokers[2].port = "127.0.0.1", 9093
    clock = FakeClock()
    admin = FakeAdmin(clock, answers_after=0.0, events=[])
    admin.list_topics = lambda timeout: Metadata()  # type: ignore[method-assign]
    bootstrap = "127.0.0.1:9092,127.0.0.1:9093"
    require_kafka(bootstrap, 5.0, None, clock=clock.now, make_admin=admin)
    # 9092 goes down later: 9093, listed by the metadata, answered.
    down = "127.0.0.1:9092/1: Connect to ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)"
    with caplog.at_level(logging.WARNING, logger="librdkafka"):
        client_logs.ClientLog(client_logs.shared_log(), bootstrap).error(KafkaError(KafkaError._TRANSPORT, down))
    assert caplog.messages == [f"Kafka broker 127.0.0.1:9092 (of {bootstrap}) is not answering: Connection refused; "
                               "the others answer"]
