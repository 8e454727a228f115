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
    consumer, producer = ClientLog(log, ADDR), ClientLog(log, ADDR)
    for i in range(20):
        consumer.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", REFUSED)
        producer.error(KafkaError(KafkaError._TRANSPORT, REFUSED))
        producer.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, f"{i % 2}/1 brokers are down"))
        clock.advance(0.1)
    assert len(lines.records) == 1
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


# ---------------------------------------------------------------- one broker down among answering ones
A, B, C = "127.0.0.1:9092", "127.0.0.1:9093", "127.0.0.1:9094"
THREE = f"{A},{B},{C}"


def refused(broker: str, name: str = "bootstrap") -> str:
    """librdkafka 2.16's words for a refused connection (measured)."""
    return f"{broker}/{name}: Connect to ipv4#{broker} failed: Connection refused (after 0ms in state CONNECT)"


def test_one_broker_of_three_refusing_is_named_not_unreachable(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    # Before: "Kafka broker unreachable at A,B,C: no broker answered (...)" for this one refusal.
    log, lines, clock = sink
    log.answered(THREE, A)  # the start-up check's metadata came from A
    client = ClientLog(log, THREE)
    client.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", f"[thrd:{B}/2]: {refused(B, '2')}")
    client.error(KafkaError(KafkaError._TRANSPORT, refused(B, "2")))
    assert lines.texts == [f"Kafka broker {B} (of {THREE}) is not answering: Connection refused; the others answer"]
    assert lines.records[0].levelno == logging.WARNING


def test_unreachable_only_once_every_broker_refused(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, clock = sink
    client = ClientLog(log, THREE)
    for broker in (A, B, C):
        client.error(KafkaError(KafkaError._TRANSPORT, refused(broker)))
        clock.advance(0.01)
    assert [t for t in lines.texts if "unreachable" in t] == [lines.texts[-1]]
    assert lines.texts[-1].startswith(f"Kafka broker unreachable at {THREE}: no broker answered")
    assert all("the others answer" not in t for t in lines.texts)  # nobody had answered


def test_all_brokers_down_from_librdkafka_is_unreachable(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, _ = sink
    client = ClientLog(log, THREE)
    client.error(KafkaError(KafkaError._TRANSPORT, refused(A)))
    client.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "0/3 brokers are down"))
    assert lines.texts[-1].startswith(f"Kafka broker unreachable at {THREE}: no broker answered")


def test_a_refusal_over_sasl_ssl_is_not_a_failed_login(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    # Before: "Kafka authentication failed at 127.0.0.1:1: ... Connection refused".
    log, lines, _ = sink
    failures: list[KafkaFailure] = []
    client = ClientLog(log, ADDR, failures.append)
    client.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1",
               f"[thrd:sasl_ssl://{ADDR}/bootstrap]: sasl_ssl://{REFUSED}")
    assert [f.kind for f in failures] == [UNREACHABLE] and not failures[0].fatal_at_start


def test_a_failure_the_caller_hears_is_not_also_a_warning(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    # Before: the warning, then the caller's error with the same words: two lines for one failure.
    log, lines, _ = sink
    failures: list[KafkaFailure] = []
    client = ClientLog(log, ADDR, failures.append)
    client.error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    client.error(KafkaError(KafkaError._TRANSPORT, REFUSED))
    assert [f.kind for f in failures] == ["authentication", UNREACHABLE]
    assert not [r for r in lines.records if r.levelno >= logging.WARNING]


def test_flush_writes_the_summary_of_a_storm_that_stopped(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    log, lines, clock = sink
    for _ in range(185):
        log.emit(logging.WARNING, "offset commit failed: ILLEGAL_GENERATION")
    clock.advance(10.0)
    log.flush()
    assert lines.texts == ["offset commit failed: ILLEGAL_GENERATION",
                           "offset commit failed: ILLEGAL_GENERATION (repeated 184 times in the last 10 s)"]


def test_all_brokers_down_while_another_answers_is_not_unreachable(sink: tuple[KafkaLog, Lines, FakeClock]) -> None:
    # Measured (produce with bootstrap "dead,live"): "1/1 brokers are down" right after
    # the dead one's refusal, from a client that had tried no other broker yet.
    log, lines, _ = sink
    log.answered(f"{A},{B}", B)
    client = ClientLog(log, f"{A},{B}")
    client.error(KafkaError(KafkaError._TRANSPORT, refused(A)))
    client.error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    warnings = [r.getMessage() for r in lines.records if r.levelno >= logging.WARNING]
    assert warnings == [f"Kafka broker {A} (of {A},{B}) is not answering: Connection refused; the others answer"]


def test_a_line_left_to_the_caller_does_not_hold_back_another_clients_warning(
    sink: tuple[KafkaLog, Lines, FakeClock],
) -> None:
    # The start-up check's client logs "unreachable" at DEBUG (the check says it); the
    # worker's consumer, a second later, must still warn with it.
    log, lines, clock = sink
    ClientLog(log, ADDR, lambda failure: None).error(KafkaError(KafkaError._TRANSPORT, REFUSED))
    clock.advance(1.0)
    ClientLog(log, ADDR).error(KafkaError(KafkaError._TRANSPORT, REFUSED))
    warnings = [r.getMessage() for r in lines.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"Kafka broker unreachable at {ADDR}")
