"""librdkafka's lines through Python logging: repeats summed up per window (fake
clock, no sleeps), the common failures in one line, one limiter for all clients, and
the wiring every confluent config of consumers/profiles.py gets."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from consumers.client_logs import ClientLog, KafkaLog, RepeatLimiter, repeat_key, wired
from consumers.kafka_failures import UNREACHABLE, KafkaFailure
from consumers.profiles import KAFKA, admin_config, consumer_config, producer_config
from pipeline.clock import FakeClock

ADDR = "127.0.0.1:1"
REFUSED = f"{ADDR}/bootstrap: Connect to ipv4#{ADDR} failed: Connection refused (after 0ms in state CONNECT)"


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @property
    def texts(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def sink() -> tuple[KafkaLog, Lines, FakeClock]:
    clock = FakeClock()
    logger = logging.getLogger(f"test.librdkafka.{id(clock)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    lines = Lines()
    logger.addHandler(lines)
    return KafkaLog(logger, window_s=10.0, clock=clock.now), lines, clock


# ---------------------------------------------------------------- the limiter
def test_first_occurrence_passes_repeats_are_counted() -> None:
    limiter = RepeatLimiter(window_s=10.0)
    assert limiter.offer("a", 0.0)
    assert not limiter.offer("a", 1.0)
    assert not limiter.offer("a", 9.9)
    assert limiter.offer("b", 2.0)  # another line has its own window
    assert limiter.due(9.99) == []
    assert limiter.due(10.0) == [(None, 2, 10.0)]


def test_a_storm_gives_one_summary_per_window() -> None:
    limiter = RepeatLimiter(window_s=10.0)
    passed, summaries = 0, []
    for tick in range(300):  # 30 s at 10 lines a second
        now = tick / 10
        summaries += limiter.due(now)
        passed += limiter.offer("storm", now, "payload")
    assert passed == 1
    assert [(p, n) for p, n, _ in summaries] == [("payload", 99), ("payload", 100)]


def test_a_quiet_window_is_forgotten_and_the_line_passes_again() -> None:
    limiter = RepeatLimiter(window_s=10.0)
    assert limiter.offer("a", 0.0)
    assert limiter.due(10.0) == []
    assert limiter.offer("a", 25.0)


def test_memory_is_bounded() -> None:
    limiter = RepeatLimiter(window_s=10.0, max_keys=3)
    for i in range(10):
        limiter.offer(f"line {i}", 0.0)
    assert len(limiter._windows) == 3


def test_repeat_key_ignores_what_varies_between_repeats() -> None:
    assert repeat_key("x failed (after 0ms in state CONNECT)") == repeat_key("x failed (after 13ms in state CONNECT)")
    assert repeat_key("1/1 brokers are down") == repeat_key("0/2 brokers are down")
    assert repeat_key("a:1 refused") != repeat_key("a:2 refused")


# ---------------------------------------------------------------- KafkaLog
def test_summary_line_says_how_often(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, clock = sink
    for _ in range(38):
        log.emit(logging.WARNING, "FAIL: something")
        clock.advance(0.25)  # 38 lines in 9.5 s
    clock.set(10.0)
    log.emit(logging.INFO, "another line")
    assert lines.texts == [
        "FAIL: something",
        "FAIL: something (repeated 37 times in the last 10 s)",
        "another line",
    ]
    assert lines.records[1].levelno == logging.WARNING


# ---------------------------------------------------------------- one client's logger and error_cb
def test_librdkafka_log_call_becomes_one_clear_line(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, _ = sink
    client = ClientLog(log, ADDR)
    client.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", f"[thrd:{ADDR}/bootstrap]: {REFUSED}")
    assert len(lines.records) == 1
    assert lines.texts[0].startswith(f"Kafka broker unreachable at {ADDR}: ")
    assert not lines.texts[0].startswith("%3|")
    assert lines.records[0].levelno == logging.WARNING  # still retrying; the caller gives up


def test_all_clients_reports_of_one_failure_count_once(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, clock = sink
    failures: list[KafkaFailure] = []
    consumer, producer = ClientLog(log, ADDR, failures.append), ClientLog(log, ADDR)
    for i in range(20):
        consumer.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", REFUSED)
        producer.error(KafkaError(KafkaError._TRANSPORT, REFUSED))
        producer.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, f"{i % 2}/1 brokers are down"))
        clock.advance(0.1)
    assert len(lines.records) == 1
    assert {f.kind for f in failures} == {UNREACHABLE}
    clock.set(10.0)
    log.emit(logging.INFO, "next")
    assert lines.texts[1].endswith("(repeated 59 times in the last 10 s)")


def test_brokers_down_after_a_refused_login_is_not_called_unreachable(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    # Before: "Kafka broker unreachable at ...: no broker answered (0/2 brokers are down)"
    # right after "Kafka authentication failed at ...": a second, wrong diagnosis.
    log, lines, _ = sink
    client = ClientLog(log, ADDR)
    client.error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    client.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "0/2 brokers are down"))
    warnings = [r.getMessage() for r in lines.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"Kafka authentication failed at {ADDR}")


def test_other_lines_keep_librdkafkas_words_without_the_client_name(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, _ = sink
    client = ClientLog(log, ADDR)
    client.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-3", "[thrd:app]: property x ignored")
    client.log(logging.DEBUG, "%s [%s] %s", "BROKER", "rdkafka#producer-3", "TLS something at debug")
    client.error(KafkaError(KafkaError.NOT_COORDINATOR, "Broker: Not coordinator"))
    assert lines.texts == ["CONFWARN: property x ignored", "BROKER: TLS something at debug", "NOT_COORDINATOR: Broker: Not coordinator"]
    assert [r.levelno for r in lines.records] == [logging.WARNING, logging.DEBUG, logging.WARNING]


def test_fatal_error_events_are_errors(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, _ = sink
    ClientLog(log, ADDR).error(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    assert lines.records[0].levelno == logging.ERROR


# ---------------------------------------------------------------- wiring
@pytest.mark.parametrize(
    "config",
    [
        consumer_config(KAFKA, ADDR, "g"),
        producer_config(KAFKA, ADDR),
        admin_config(ADDR),
    ],
    ids=["consumer", "producer", "admin"],
)
def test_every_profile_config_is_wired(config: dict) -> None:
    assert isinstance(config["logger"], ClientLog)
    assert config["error_cb"].__self__ is config["logger"]


def test_a_callers_own_logger_wins() -> None:
    own = logging.getLogger("mine")
    conf = wired({"bootstrap.servers": ADDR, "logger": own})
    assert conf["logger"] is own and callable(conf["error_cb"])
