"""An ETL range read when the broker calls an offset out of range
(pipeline/etl/topic.py `_records`): it asks again for the same offset and never hands
on a record before it. The profile's auto.offset.reset "earliest" had librdkafka jump
back to the log's start instead, and a job reading offsets 10..99 got 0..9 first
(Apache Kafka answered OFFSET_OUT_OF_RANGE once for an offset it held, in CI)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from pipeline import kafka_backend
from pipeline.errors import UserError
from pipeline.etl import topic as etl_topic
from pipeline.etl.topic import PartitionRange, _consumer, _records


class _Err:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return False

    def str(self) -> str:
        return f"error {self._code}"


class _Msg:
    def __init__(self, offset: int, err: _Err | None = None) -> None:
        self._offset, self._err = offset, err

    def error(self) -> _Err | None:
        return self._err

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return 0


class _Consumer:
    """First the reset event, then what librdkafka serves after the re-assign; records
    from 0 stand for a consumer that jumped back to the log's start."""

    def __init__(self, batches: list[list[_Msg]]) -> None:
        self.batches = batches
        self.assigned: list[list[tuple[str, int, int]]] = []

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        return self.batches.pop(0) if self.batches else []

    def assign(self, tps) -> None:  # noqa: ANN001
        self.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in tps])


def test_an_out_of_range_answer_asks_again_for_the_same_offset(monkeypatch) -> None:
    monkeypatch.setattr(etl_topic, "_RESET_BACKOFF_S", 0.0)
    reset = _Msg(-1, _Err(KafkaError._AUTO_OFFSET_RESET))
    before = [_Msg(o) for o in range(0, 10)]  # what a jump to the log's start would serve
    inside = [_Msg(o) for o in range(10, 20)]
    c = _Consumer([[reset], before + inside])
    rng = PartitionRange("t", 0, 10, 20)
    got = [m.offset() for m in _records(c, rng, 10)]  # type: ignore[arg-type]
    assert got == list(range(10, 20))
    assert c.assigned == [[("t", 0, 10)]]  # asked again from offset 10, not 0


def test_the_etl_consumer_turns_a_reset_into_an_event(monkeypatch) -> None:
    seen: dict = {}
    monkeypatch.setattr(kafka_backend, "Consumer", lambda conf: seen.update(conf) or object())
    _consumer("127.0.0.1:1", "kafka", None)
    assert seen["auto.offset.reset"] == "error" and seen["enable.partition.eof"] is True


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _ForeverOutOfRange(_Consumer):
    """A log whose start has passed the offset asked (retention deleted it): every
    fetch is answered out of range; each poll takes the poll's time on `clock`."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__([])
        self.clock, self.polls = clock, 0

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        self.polls += 1
        assert self.polls < 10_000, "still asking after 10,000 polls: the read never gives up"
        self.clock.now += timeout
        return [_Msg(-1, _Err(KafkaError._AUTO_OFFSET_RESET))]


def test_an_offset_out_of_range_for_the_stall_time_ends_the_read_with_one_line() -> None:
    # CI, 2026-12-05: records stamped 2026-01-01 were deleted by Kafka's 7-day retention
    # between their produce and the ETL read; the read asked offset 0 of a log that
    # began at 150 until pytest's 300 s timeout.
    clock = _Clock()
    c = _ForeverOutOfRange(clock)
    rng = PartitionRange("t", 1, 0, 150)
    with pytest.raises(UserError, match=r"^t\[1\]: offset 0 out of range for 30 s: the broker no longer holds it"):
        list(_records(c, rng, 0, clock=clock, sleep=lambda s: None))  # type: ignore[arg-type]
    assert 30.0 < clock.now < 31.0


def test_the_callers_time_between_records_is_no_stall() -> None:
    # A chunk scored for longer than the stall time between two records of one poll.
    clock = _Clock()
    c = _Consumer([[_Msg(0), _Msg(1)], [_Msg(2)]])
    got = []
    for m in _records(c, PartitionRange("t", 0, 0, 3), 0, clock=clock, sleep=lambda s: None):  # type: ignore[arg-type]
        got.append(m.offset())
        clock.now += 100.0
    assert got == [0, 1, 2]
