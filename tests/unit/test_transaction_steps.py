"""consumers/confluent_backend.py's transaction steps, on a scripted librdkafka producer:
a commit that timed out is resumed without sending the offsets again (librdkafka
refuses that, and every abort after it), and a step librdkafka does not return from
is given up as fatal after its timeout + CALL_MARGIN_S."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers.confluent_backend import ConfluentTransactionalProducer, _StepThread
from consumers.records import TransactionError


class Scripted:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.commit_timeouts = 1
        self.hang = threading.Event()

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(self, parts, metadata, timeout) -> None:
        if self.calls.count("offsets") and self.calls[-1] == "commit":
            raise KafkaException(KafkaError(KafkaError._CONFLICT, "Conflicting commit_transaction API call is "
                                            "already in progress", retriable=True))
        self.calls.append("offsets")

    def commit_transaction(self, timeout) -> None:
        self.calls.append("commit")
        if self.commit_timeouts:
            self.commit_timeouts -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out waiting for operation to finish, "
                                            "retry call to resume", retriable=True))

    def abort_transaction(self, timeout) -> None:
        self.hang.wait()  # librdkafka not keeping its timeout


def producer(inner: Scripted, margin: float = 5.0) -> ConfluentTransactionalProducer:
    p = ConfluentTransactionalProducer.__new__(ConfluentTransactionalProducer)
    p._producer, p._steps, p._offsets_in = inner, _StepThread(), False
    p.CALL_MARGIN_S = margin
    return p


def test_a_timed_out_commit_is_resumed_not_sent_again() -> None:
    inner = Scripted()
    p = producer(inner)
    p.begin_transaction()
    with pytest.raises(TransactionError) as err:
        p.commit_transaction({("req", 0): 5}, "metadata", 1.0)
    assert err.value.retriable and not err.value.fatal
    p.commit_transaction({("req", 0): 5}, "metadata", 1.0)  # the retry resumes the commit
    assert inner.calls == ["begin", "offsets", "commit", "commit"]
    p.begin_transaction()
    p.commit_transaction({("req", 0): 9}, "metadata", 1.0)  # a new transaction sends its offsets
    assert inner.calls[-3:] == ["begin", "offsets", "commit"]


def test_a_step_that_does_not_return_is_given_up_as_fatal() -> None:
    inner = Scripted()
    p = producer(inner, margin=0.05)
    try:
        with pytest.raises(TransactionError, match="did not return within") as err:
            p.abort_transaction(0.05)
        assert err.value.fatal
    finally:
        inner.hang.set()
