"""A storm of one failed commit is one line with a count (issue 49): after a member was
SIGKILLed, its survivor's queued asynchronous commits all failed at once, 185 identical
"offset commit failed: ILLEGAL_GENERATION" warnings in 164 ms. A fake source and a
fake clock: no broker, no sleeps."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.offsets import OffsetTracker
from consumers.records import TopicPartition
from pipeline.clock import FakeClock
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.partitions import Partitions
from pipeline.delivery.stats import WorkerStats
from pipeline.observe.metrics import WorkerMetrics

TP: TopicPartition = ("in", 0)
# confluent-kafka's error for a commit of a generation the group has left behind.
ILLEGAL = KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "Commit failed: Broker: Specified group generation id is not valid"))


class QueuedCommits:
    """Keeps asynchronous commits until `fail_all`, as a consumer whose group stalls."""

    def __init__(self) -> None:
        self.waiting: list[Callable[[Exception | None], None]] = []

    def commit(self, offsets: dict, on_done: Callable[[Exception | None], None] | None = None) -> None:
        assert on_done is not None
        self.waiting.append(on_done)

    def fail_all(self, err: Exception) -> None:
        for on_done in self.waiting:
            on_done(err)
        self.waiting.clear()


def test_185_failed_commits_are_one_line_and_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    tracker, source = OffsetTracker(), QueuedCommits()
    metrics = WorkerMetrics("ctr", "adaptive")
    lifecycle = Lifecycle()
    lifecycle.source = source  # type: ignore[assignment]
    parts = Partitions(tracker, lifecycle, None, [], metrics, "ctr", WorkerStats(),  # type: ignore[arg-type]
                       lambda: None, clock=clock.now)
    for offset in range(185):  # one commit per interval while the group waits out the dead member
        tracker.track(TP, offset)
        tracker.ack(TP, offset)
        parts.commit(wait=False)
    with caplog.at_level(logging.WARNING, logger="pipeline.delivery.partitions"):
        source.fail_all(ILLEGAL)  # all at once, within 164 ms
        clock.advance(10.0)
        parts.commit(wait=False)  # the next interval: the storm's count
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.delivery.partitions"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("offset commit failed: ") and "ILLEGAL_GENERATION" in lines[0]
    assert lines[1] == f"{lines[0]} (repeated 184 times in the last 10 s)"
    assert metrics.commits.labels("ctr", "error")._value.get() == 185  # every failure still counted
