"""An ETL range read when the broker calls an offset out of range
(pipeline/etl/topic.py `_records`): it asks again for the same offset and never hands
on a record before it. The profile's auto.offset.reset "earliest" had librdkafka jump
back to the log's start instead, and a job reading offsets 10..99 got 0..9 first
(Apache Kafka answered OFFSET_OUT_OF_RANGE once for an offset it held, in CI)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from pipeline import kafka_backend
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
