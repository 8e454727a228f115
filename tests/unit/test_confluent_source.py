"""ConfluentSource.poll_batch with a stand-in consumer: which errors stop the worker.
No network I/O."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.confluent_backend import ConfluentSource


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
