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
