"""ConfluentSource.poll_batch with a stand-in consumer: which errors stop the worker.
No network I/O."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.confluent_backend import ConfluentSource
from consumers.records import KafkaRefused


class _Message:
    def __init__(self, err: KafkaError) -> None:
        self._err = err

    def error(self) -> KafkaError:
        return self._err


class _Consumer:
    def __init__(self, messages: list[_Message]) -> None:
        self.messages = messages

    def consume(self, num_messages: int, timeout: float) -> list[_Message]:
        out, self.messages = self.messages, []
        return out


def _source(*errors: KafkaError) -> ConfluentSource:
    source = ConfluentSource.__new__(ConfluentSource)  # no client, no connection
    source._consumer = _Consumer([_Message(e) for e in errors])
    source._bootstrap = "kafka.example:9093"
    return source


def test_a_fatal_error_event_stops_the_source() -> None:
    """librdkafka reports a fatal error (e.g. KIP-848's UNRELEASED_INSTANCE_ID for a
    static member restarted too early) as an event with code _FATAL whose fatal() is
    False; the consumer never recovers, so the worker must exit instead of idling."""
    event = KafkaError(KafkaError._FATAL, "instance ID is still used", fatal=False)
    with pytest.raises(KafkaException):
        _source(event).poll_batch(10, 0.0)


def test_transient_errors_and_partition_eof_are_skipped() -> None:
    errors = (KafkaError(KafkaError._PARTITION_EOF), KafkaError(KafkaError._TRANSPORT, "broker down"))
    assert _source(*errors).poll_batch(10, 0.0) == []


@pytest.mark.parametrize(
    ("code", "text", "says"),
    [
        (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            "Subscribed topic not available: ctr.requests: Broker: Topic authorization failed",
            "topic authorization failed",
        ),
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "JoinGroup failed: Broker: Group authorization failed", "group authorization"),
    ],
)
def test_a_missing_acl_stops_the_source_with_one_line(code: int, text: str, says: str) -> None:
    """The broker refuses every retry alike; a worker idling on it would look like one
    with nothing to do."""
    with pytest.raises(KafkaRefused) as caught:
        _source(KafkaError(code, text)).poll_batch(10, 0.0)
    line = str(caught.value)
    assert says in line.lower() and "kafka.example:9093" in line and text in line


def test_the_timestamp_type_reaches_the_record() -> None:
    """LogAppendTime (topic config message.timestamp.type) is the broker's append time:
    the worker splits the produce leg off only then (pipeline/worker/publisher.py).
    Real confluent_kafka Messages, as librdkafka hands them over."""
    from confluent_kafka import (
        TIMESTAMP_CREATE_TIME,
        TIMESTAMP_LOG_APPEND_TIME,
        TIMESTAMP_NOT_AVAILABLE,
        Message,
    )

    source = ConfluentSource.__new__(ConfluentSource)
    source._consumer = _Consumer([
        Message(topic="in", partition=0, offset=i, value=b"{}", headers=[("tidebatch.produced_ms", b"90")],
                timestamp=(kind, 100))
        for i, kind in enumerate((TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE))
    ])
    got = source.poll_batch(10, 0.0)
    assert [(r.log_append_time, r.timestamp_ms) for r in got] == [(True, 100), (False, 100), (False, None)]
    assert got[0].headers == {"tidebatch.produced_ms": b"90"}


class _Rebalancing:
    """A consumer whose consume() serves a rebalance callback half-way, as librdkafka's
    rd_kafka_q_serve_rkmessages does, and returns every message it took off the queue,
    before the callback and after it."""

    def __init__(self, before: list, callbacks: list, after: list) -> None:
        self.before, self.callbacks, self.after = before, callbacks, after

    def consume(self, num_messages: int, timeout: float) -> list:
        out = self.before + self.after
        for callback, parts in self.callbacks:
            callback(self, parts)
        self.before, self.callbacks, self.after = [], [], []
        return out


def _rebalancing_source(before: list, callbacks: list, after: list) -> tuple[ConfluentSource, list]:
    from confluent_kafka import TopicPartition as CkTopicPartition

    calls: list = []
    source = ConfluentSource.__new__(ConfluentSource)
    source._paused = False
    source._let_go = set()
    source._on_revoke = lambda tps: calls.append(("revoke", tps))
    source._on_assign = lambda tps: calls.append(("assign", tps))
    named = {"revoke": source._revoked, "assign": source._assigned}
    source._consumer = _Rebalancing(
        before, [(named[name], [CkTopicPartition("in", p) for p in parts]) for name, parts in callbacks], after
    )
    return source, calls


def _msg(partition: int, offset: int):
    from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

    return Message(topic="in", partition=partition, offset=offset, value=b"{}", timestamp=(TIMESTAMP_CREATE_TIME, 1))


def test_records_of_a_partition_let_go_during_the_poll_are_dropped() -> None:
    """A zombie wakes with fetched records of its partitions queued ahead of the lost
    callback. Returned after the callback, they were taken in as if still owned and
    scored beside the next owner; with exactly_once their results and offsets would
    commit once the worker had rejoined the group (a member's offsets are checked by
    generation, not by ownership): a second read_committed result, the likely cause of
    test_zombie_worker_is_fenced[txn-open-on-wake]'s one duplicate in a CI run."""
    source, calls = _rebalancing_source(
        before=[_msg(1, 7), _msg(0, 3), _msg(1, 8)], callbacks=[("revoke", [1])], after=[_msg(0, 4)]
    )
    got = source.poll_batch(10, 0.0)
    assert calls == [("revoke", [("in", 1)])]
    assert [(r.partition, r.offset) for r in got] == [(0, 3), (0, 4)]


def test_a_partition_assigned_again_in_the_same_poll_keeps_its_records_and_the_next_poll_starts_afresh() -> None:
    source, _ = _rebalancing_source(
        before=[_msg(1, 7)], callbacks=[("revoke", [1]), ("assign", [1])], after=[_msg(1, 9)]
    )
    assert [(r.partition, r.offset) for r in source.poll_batch(10, 0.0)] == [(1, 7), (1, 9)]
    source2, _ = _rebalancing_source(before=[_msg(2, 1)], callbacks=[("revoke", [2])], after=[])
    assert source2.poll_batch(10, 0.0) == []
    source2._consumer = _Rebalancing([_msg(2, 5)], [], [])  # assigned again later: a new poll
    assert [(r.partition, r.offset) for r in source2.poll_batch(10, 0.0)] == [(2, 5)]
