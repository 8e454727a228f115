"""librdkafka's own logs and error events, through Python logging and rate-limited.

Left alone, librdkafka prints every failed connection attempt to stderr from its own
threads (`%3|...|FAIL|...`): against an unreachable broker a worker printed 194 such
lines in 11 s and `tidebatch produce` 473 in 25 s, burying the one line that said
what was wrong. Every confluent-kafka client the project creates gets its config from
consumers/profiles.py, which passes it through `wired()` here, so each one:

- logs through the Python logger "librdkafka" (served by the client's poll(), in the
  thread that polls), never straight to stderr;
- says the common failures (consumers/kafka_failures.py) in one clear line, and
  every other line as librdkafka wrote it, without the client's name, so the same
  line from the consumer, the producer and the admin client counts as one;
- repeats a line at most once per window (10 s): the repeats are summed up as
  "<line> (repeated 37 times in the last 10 s)" when the window ends;
- calls a refused connection "unreachable" only when no broker answers: one broker
  down among answering ones is a warning naming it (consumers/broker_states.py).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.broker_states import BrokerStates
from consumers.kafka_failures import (
    BROKER_DOWN,
    FATAL_AT_START,
    UNREACHABLE,
    KafkaFailure,
    broker_down_line,
    classify,
    detail,
)

LOGGER_NAME = "librdkafka"
WINDOW_S = 10.0

FailureCallback = Callable[[KafkaFailure], None]

# Parts of a librdkafka line that change between otherwise identical repeats.
_VARYING = re.compile(r"\(after \d+ms|\b\d+/\d+ brokers")


def repeat_key(text: str) -> str:
    """`text` with the parts that differ between repeats of the same event blanked."""
    return _VARYING.sub(lambda m: "(after #ms" if m.group(0).startswith("(") else "#/# brokers", text)


@dataclass
class _Window:
    start: float
    repeats: int
    payload: Any


class RepeatLimiter:
    """Lets the first occurrence of a key through, counts the repeats within
    `window_s`, and reports them when the window ends (`due`). Pure: the caller passes
    the time. A key whose window ended with repeats opens a new window at once, so a
    storm gives one summary per window; one that ended quiet is forgotten."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = 1000) -> None:
        self.window_s = window_s
        # Bounds memory if librdkafka ever logs an endless variety of lines.
        self._max_keys = max_keys
        self._windows: dict[str, _Window] = {}

    def offer(self, key: str, now: float, payload: Any = None) -> bool:
        """True: log this occurrence now. False: counted, summed up by `due`."""
        window = self._windows.get(key)
        if window is not None and now - window.start < self.window_s:
            window.repeats += 1
            return False
        if len(self._windows) >= self._max_keys:
            self._windows.pop(next(iter(self._windows)))
        self._windows[key] = _Window(now, 0, payload)
        return True

    def due(self, now: float) -> list[tuple[Any, int, float]]:
        """(payload, repeats, seconds) for each window that has ended with repeats."""
        out = []
        for key, window in list(self._windows.items()):
            elapsed = now - window.start
            if elapsed < self.window_s:
                continue
            if window.repeats:
                out.append((window.payload, window.repeats, elapsed))
                self._windows[key] = _Window(now, 0, window.payload)
            else:
                del self._windows[key]
        return out


class KafkaLog:
    """Where every wired client's lines go: one limiter for the whole process, so the
    consumer's, the producer's and the admin client's copies of a line count once."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self._limiter = RepeatLimiter(window_s)
        self._clock = clock
        # Per bootstrap list: which brokers refuse. Shared by all clients of the
        # process, so the start-up check's answer counts for the worker's clients.
        self._brokers: dict[str, BrokerStates] = {}
        # Clients are polled from several threads (the worker's source thread, the
        # main thread's admin calls).
        self._lock = threading.Lock()

    def emit(self, level: int, text: str, key: str | None = None) -> None:
        with self._lock:
            now = self._clock()
            due = self._limiter.due(now)
            fresh = self._limiter.offer(key or repeat_key(text), now, (level, text))
        self._write(due)
        if fresh:
            self.logger.log(level, "%s", text)

    def flush(self) -> None:
        """Write the summaries of the windows that have ended (a storm that stopped
        would otherwise be summed up only when the next line comes)."""
        with self._lock:
            due = self._limiter.due(self._clock())
        self._write(due)

    def _write(self, due: list[tuple[Any, int, float]]) -> None:
        for (was_level, was_text), repeats, seconds in due:
            self.logger.log(was_level, "%s (repeated %d times in the last %.0f s)", was_text, repeats, seconds)

    def answered(self, bootstrap: str, broker: str) -> None:
        """A broker of `bootstrap` answered (e.g. the start-up check's metadata request)."""
        with self._lock:
            self._states(bootstrap).answered(broker, self._clock())

    def name_refusal(
        self, bootstrap: str, failure: KafkaFailure, code_name: str | None, message: str
    ) -> KafkaFailure | None:
        """`failure` as it stands once the brokers' states are known: a refusal while
        another broker answers (or has not failed) names that broker instead of
        saying "no broker answered"; None for librdkafka's "all brokers are down"
        while another broker answers (consumers/broker_states.py)."""
        with self._lock:
            now = self._clock()
            states = self._states(bootstrap)
            if failure.broker is not None and failure.kind in FATAL_AT_START:
                states.answered(failure.broker, now)  # it answered the handshake
            if failure.kind != UNREACHABLE:
                return failure
            if code_name == "_ALL_BROKERS_DOWN":
                states.all_down(now)
                return failure if states.none_answers(now) else None
            if failure.broker is None:
                return failure
            states.refused(failure.broker, now)
            if states.none_answers(now):
                return failure
            others = states.others_answer(failure.broker, now)
        return KafkaFailure(BROKER_DOWN, broker_down_line(failure.broker, bootstrap, message, others), failure.broker)

    def _states(self, bootstrap: str) -> BrokerStates:
        if bootstrap not in self._brokers:
            self._brokers[bootstrap] = BrokerStates(bootstrap)
        return self._brokers[bootstrap]


class ClientLog:
    """One client's `logger` (confluent-kafka calls its `log`) and `error_cb`."""

    def __init__(self, sink: KafkaLog, bootstrap: str, on_failure: FailureCallback | None = None) -> None:
        self._sink = sink
        self._bootstrap = bootstrap
        # A caller that hears the failures says the fatal ones itself, as its error
        # (consumers/kafka_reachable.py raises them): a warning with the same words
        # first made every failure two lines.
        self._on_failure = on_failure
        # Set once a broker refused our login or TLS handshake: librdkafka then also says
        # "N/N brokers are down", which would read as a second, wrong diagnosis.
        self._refused_at_door = False

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """confluent-kafka's call: log(level, "%s [%s] %s", facility, client name, text)."""
        if len(args) == 3:
            facility, _client, message = args
            plain = f"{facility}: {detail(str(message))}"
            if level < logging.WARNING:  # never a failure; not worth reading its text
                self._sink.emit(level, plain)
                return
            self._report(None, str(message), level, plain)
        else:  # not the shape confluent-kafka 2.x uses; keep the line whatever it is
            self._sink.emit(level, fmt % args if args else fmt)

    def error(self, err: Any) -> None:
        """error_cb: librdkafka's error events (a KafkaError)."""
        level = logging.ERROR if err.fatal() else logging.WARNING
        self._report(err.name(), err.str(), level, f"{err.name()}: {err.str()}")

    def _report(self, code_name: str | None, message: str, level: int, plain: str) -> None:
        failure = classify(code_name, message, self._bootstrap)
        if failure is None:
            self._sink.emit(level, plain)
            return
        if failure.fatal_at_start:
            self._refused_at_door = True
        elif self._refused_at_door and code_name == "_ALL_BROKERS_DOWN":
            self._sink.emit(logging.DEBUG, plain)
            return
        named = self._sink.name_refusal(self._bootstrap, failure, code_name, message)
        if named is None:  # not true of the cluster: librdkafka's words, for DEBUG readers
            self._sink.emit(logging.DEBUG, plain)
            return
        failure = named
        # One key per failure kind and address (and broker, for one that is down): all
        # clients' reports of it count once.
        where = f"{failure.broker}@" if failure.kind == BROKER_DOWN else ""
        key = f"{failure.kind}@{where}{self._bootstrap}"
        if self._on_failure is not None and failure.kind in _CALLERS_TO_SAY:
            # A key of its own: this DEBUG line must not hold back another client's warning.
            self._sink.emit(logging.DEBUG, failure.line, key=f"{key} (the caller's)")
        else:
            # Still retrying: a warning. Whoever gives up says so in its own error line.
            self._sink.emit(logging.WARNING, failure.line, key=key)
        if self._on_failure is not None:
            self._on_failure(failure)


# What a caller hearing the failures (on_failure) turns into its own error line.
_CALLERS_TO_SAY = FATAL_AT_START | {UNREACHABLE}

_shared: KafkaLog | None = None
_shared_lock = threading.Lock()


def shared_log() -> KafkaLog:
    """The process's KafkaLog: one limiter for all its clients."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = KafkaLog()
        return _shared


def wired(
    config: Mapping[str, Any],
    on_failure: FailureCallback | None = None,
    sink: KafkaLog | None = None,
) -> dict[str, Any]:
    """A copy of a confluent-kafka client config whose logs and error events go
    through Python logging (a caller's own `logger` / `error_cb` win).
    `on_failure` hears every classified failure (consumers/kafka_reachable.py)."""
    conf = dict(config)
    client = ClientLog(sink or shared_log(), str(conf.get("bootstrap.servers", "?")), on_failure)
    conf.setdefault("logger", client)
    conf.setdefault("error_cb", client.error)
    return conf
