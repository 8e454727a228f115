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
