"""KafkaPythonProducer.poll(timeout) waits like confluent's Producer.poll: the worker's
source loop waits in it while backpressure holds intake and while a revoke drains.
It used to return at once, which made that loop spin on the GIL the executor needs."""

from __future__ import annotations

from consumers import kafka_python_backend as kp


def test_poll_waits_for_its_timeout_and_poll_zero_does_not(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(kp.time, "sleep", slept.append)
    producer = object.__new__(kp.KafkaPythonProducer)  # poll touches no client state
    assert producer.poll(0.005) == 0
    assert producer.poll(0) == 0
    assert producer.poll() == 0
    assert slept == [0.005]


def test_a_record_refused_before_sending_is_reported_through_on_ack_not_raised():
    """kafka-python raises MessageSizeTooLargeError from send() itself; raised in the
    worker's source thread, that stopped the worker on a dead-letter copy."""
    from kafka.errors import MessageSizeTooLargeError

    class Refusing:
        def send(self, *_a, **_kw):
            raise MessageSizeTooLargeError("The message is 2000000 bytes when serialized")

    producer = object.__new__(kp.KafkaPythonProducer)
    producer._producer = Refusing()
    producer._lock = kp.threading.Lock()
    producer._in_flight = 0
    acks = []
    producer.send("t.dlq", b"k", b"v" * 10, None, acks.append)
    [err] = acks
    assert err.refused and "MessageSizeTooLargeError" in err.reason
    assert len(producer) == 0


def test_the_confluent_producer_reports_an_oversized_record_through_on_ack():
    from consumers.confluent_backend import ConfluentProducer

    producer = ConfluentProducer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": 10_000, "log_level": 0})
    assert producer.max_record_bytes == 10_000
    acks = []
    producer.send("t.dlq", b"k", b"v" * 20_000, None, acks.append)
    [err] = acks
    assert err.refused and "too large" in err.reason.lower()
