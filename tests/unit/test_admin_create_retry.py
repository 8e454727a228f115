"""consumers/admin.py: creating topics rides out a broker handle librdkafka dropped
mid-request (seen on a 3-node Apache Kafka right after start), and still fails at once
on errors of the request itself."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from consumers import admin


class FakeAdmin:
    """create_topics answers each call with the next error (None: created)."""

    def __init__(self, *answers: int | None) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def create_topics(self, new, operation_timeout: float, request_timeout: float) -> dict[str, Future]:
        self.calls.append([t.topic for t in new])
        code = self.answers.pop(0)
        out = {}
        for topic in new:
            future: Future = Future()
            if code is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            out[topic.topic] = future
        return out


def create(fake: FakeAdmin, seconds: float = 5.0) -> None:
    admin._create(fake, ["t"], {"t": 3}, 3, None, time.monotonic() + seconds)  # type: ignore[arg-type]


def test_a_destroyed_broker_handle_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin.time, "sleep", lambda _s: None)
    fake = FakeAdmin(KafkaError._DESTROY_BROKER, None)
    create(fake)
    assert fake.calls == [["t"], ["t"]]


def test_a_retry_that_finds_the_topic_created_is_fine(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first request may have reached the controller before the handle went.
    monkeypatch.setattr(admin.time, "sleep", lambda _s: None)
    fake = FakeAdmin(KafkaError._DESTROY_BROKER, KafkaError.TOPIC_ALREADY_EXISTS)
    create(fake)
    assert len(fake.calls) == 2


def test_an_error_of_the_request_is_not_retried() -> None:
    fake = FakeAdmin(KafkaError.INVALID_REPLICATION_FACTOR)
    with pytest.raises(admin.AdminError, match="cannot create topic 't'"):
        create(fake)
    assert len(fake.calls) == 1


def test_retries_end_at_the_deadline() -> None:
    fake = FakeAdmin(KafkaError._DESTROY_BROKER)
    with pytest.raises(admin.AdminError, match="destroyed"):
        create(fake, seconds=0.0)
    assert len(fake.calls) == 1
