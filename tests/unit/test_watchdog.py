"""pipeline/delivery/watchdog.py: a client call past its deadline is noticed (logged once,
/healthz fails), a signal reaches the worker even while the main thread is inside a
call, and a process still running exit_after_s after its stop began is ended (exit 1)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from pipeline.delivery.watchdog import CallWatch, Watchdog
from pipeline.ops.health import liveness


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeWorker:
    def __init__(self, clock: Clock) -> None:
        self.calls = CallWatch(clock)
        self.stopping = False
        self.reasons: list[str] = []

    def stop(self, reason: str) -> None:
        self.reasons.append(reason)
        self.stopping = True


def test_a_call_past_its_deadline_is_overdue_until_it_returns() -> None:
    clock = Clock()
    calls = CallWatch(clock)
    assert calls.overdue(clock()) is None
    with calls.call("commit_transaction", 65.0):
        clock.t += 65.0
        assert calls.overdue(clock()) is None
        clock.t += 600.0
        assert calls.overdue(clock()) == "Kafka call commit_transaction has run 665 s, past its 65 s deadline"
    assert calls.overdue(clock()) is None


def test_overdue_is_logged_once_and_the_stop_is_enforced(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    worker = FakeWorker(clock)
    exits: list[int] = []
    dog = Watchdog(worker, exit_after_s=34.0, exit=exits.append, clock=clock)
    with worker.calls.call("send_offsets_to_transaction", 30.0), caplog.at_level(logging.ERROR):
        for _ in range(10):
            clock.t += 5.0
            dog.check()
        assert [r.message for r in caplog.records if r.name == "pipeline.delivery.watchdog"] == [
            "Kafka call send_offsets_to_transaction has run 35 s, past its 30 s deadline: "
            "the worker is not alive until it returns (/healthz 503)"]
        dog.signalled(signal.SIGTERM)  # the main thread is still inside the call
        assert worker.reasons == ["signal SIGTERM"]
        for _ in range(7):
            clock.t += 5.0
            dog.check()
        assert exits == []  # 30 s after the stop began: within drain_timeout_s + margin
        clock.t += 5.0
        dog.check()
    assert exits == [1]
    ours = [r.message for r in caplog.records if r.name == "pipeline.delivery.watchdog"]
    assert "exiting now with nothing more committed" in ours[-1]


def test_a_worker_that_stops_in_time_is_left_alone() -> None:
    clock = Clock()
    worker = FakeWorker(clock)
    exits: list[int] = []
    dog = Watchdog(worker, exit_after_s=34.0, exit=exits.append, clock=clock)
    dog.signalled(signal.SIGUSR1)  # not a stop
    assert not worker.stopping
    dog.signalled(signal.SIGINT)
    for _ in range(6):
        clock.t += 5.0
        dog.check()
    assert exits == [] and worker.reasons == ["signal SIGINT"]


def test_liveness_fails_while_a_call_is_overdue() -> None:
    clock = Clock()
    started = threading.Event()
    started.set()
    worker = SimpleNamespace(started=started, stopping=False, failure=None, threads=lambda: [], last_poll_ok=None,
                             calls=CallWatch(clock))
    with worker.calls.call("abort_transaction", 40.0):
        clock.t += 41.0
        alive, body = liveness(worker, clock())
    assert not alive and body["reason"] == "Kafka call abort_transaction has run 41 s, past its 40 s deadline"
    assert liveness(worker, clock())[0]


def test_a_signal_reaches_the_watchdog_through_the_wakeup_fd() -> None:
    # A real signal, a real thread: the watchdog sees it through set_wakeup_fd even if
    # the main thread were busy (here it is only sleeping, with a handler installed).
    clock = Clock()
    worker = FakeWorker(clock)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    dog = Watchdog(worker, exit_after_s=1000.0, exit=lambda code: None, tick_s=0.05).start()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not worker.reasons and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        dog.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, previous)
    assert worker.reasons == ["signal SIGTERM"]


def test_the_exit_line_names_the_failure_that_stopped_the_worker(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: a worker whose new credentials were refused could not deliver its
    in-flight results, its drain ran out, and the watchdog's line ended the log without
    the reason (tests/integration/test_kafka_rotation.py read the last line)."""
    clock = Clock()
    worker = FakeWorker(clock)
    worker.failure = "Kafka authentication failed at h:1 after the credentials changed on the broker"
    exits: list[int] = []
    dog = Watchdog(worker, exit_after_s=34.0, exit=exits.append, clock=clock)
    worker.stop("failed")
    with caplog.at_level(logging.ERROR):
        for _ in range(8):
            clock.t += 5.0
            dog.check()
    assert exits == [1]
    last = [r.getMessage() for r in caplog.records if r.name == "pipeline.delivery.watchdog"][-1]
    assert last.endswith("; it stopped on error: Kafka authentication failed at h:1 after the credentials "
                         "changed on the broker")
