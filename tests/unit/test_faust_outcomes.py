"""A Faust app writes the worker's records (pipeline/faust/outcomes.py sends what
pipeline/delivery/outcomes.py builds): for the same request and outcome -- its result,
its dead letter for each reason, its late record -- the same topic, key, value and
headers, byte for byte. The worker's side goes through its own rooms (admission,
executors, publisher) into a fake producer; the Faust side through FaustOutcomes into
fake Faust topics. Clock readings are passed in."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from consumers.dead_letter import H_DEADLINE_MISSED_BY, H_ERROR, H_LATE_RULE, H_STAGE, Origin
from consumers.offsets import OffsetTracker
from consumers.records import AckCallback, SourceRecord
from models.registry import ModelSpec
from pipeline.batching.request import RULE_OVERDUE, RULE_SHED, Batch, Request
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.outcomes import Outcomes, Topics
from pipeline.delivery.stats import WorkerStats
from pipeline.faust.batch import FaustBatch, Rejected
from pipeline.faust.core import Pending
from pipeline.faust.outcomes import FAUST_LIMITS, FAUST_MAX_RECORD_BYTES, FaustOutcomes
from pipeline.observe.metrics import WorkerMetrics
from pipeline.observe.tracing import TRACE_HEADERS
from pipeline.scoring import BatchTiming, ScoringStep, score_batch
from pipeline.versions.slot import ModelSlot
from pipeline.worker.admission import Admission, InFlight
from pipeline.worker.executors import Executors, Finished
from pipeline.worker.publisher import Publisher

WALL = 1_700_000_000_000
DEADLINE = WALL + 10_000.0
MODEL = ModelSpec("toy", "1", Path("unused.onnx"), [], [], {})
TOPICS = Topics.for_input("requests", "scores", None, None)
ORIGIN = Origin("toy-group", "toy-member", "tests.unit.ToyCodec")
TIMING = BatchTiming(batch_rows=3, seconds=0.003, started_wall=WALL + 5, done_wall=WALL + 9)
Sent = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]] | None]


class ToyCodec:
    """b"bad" is invalid input, b"crash" a codec bug, b"poison" the model refuses,
    b"set" has a result that cannot be serialised, b"huge" one over the record limit."""

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        assert value is not None
        if value == b"bad":
            raise DecodeError("field 'x' is missing")
        if value == b"crash":
            raise ZeroDivisionError("oops")
        return Decoded(request_id=value.decode(), rows=1, payload=value)

    def collate(self, payloads: Sequence[Any], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        return {"x": np.array([p == b"poison" for p in payloads])}

    def split(self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]) -> list[dict]:
        extra = {b"set": {"tags": {1, 2}}, b"huge": {"pad": "x" * FAUST_MAX_RECORD_BYTES}}
        return [{"score": float(i), **extra.get(d.payload, {})} for i, d in enumerate(decoded)]


def toy_step() -> ScoringStep:
    """ToyCodec's requests through a model that refuses every batch holding b"poison"."""

    def run_timed(feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        if feeds["x"].any():
            raise RuntimeError("model refuses this input\nsecond line of the ORT error")
        return dict(feeds), 0.001 * len(feeds["x"])

    return ScoringStep(MODEL, ToyCodec(), SimpleNamespace(provider="cpu", run_timed=run_timed))  # type: ignore[arg-type]


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any, on_ack: AckCallback) -> None:
        self.sent.append((topic, key, value, headers))
        on_ack(None)


class FakeTopic:
    """A Faust topic: its one name, and send() handing back a delivery future."""

    def __init__(self, name: str, sent: list[Sent]) -> None:
        self.name = name
        self.sent = sent

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, *, key: bytes | None, value: bytes | None, headers: Any) -> asyncio.Future:
        self.sent.append((self.name, key, value, headers))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def record(offset: int, value: bytes) -> SourceRecord:
    headers = {"traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "other": b"x"}
    return SourceRecord("requests", 0, offset, f"key-{offset}".encode(), value, headers, WALL)


def event(rec: SourceRecord) -> Any:
    """The Faust event a Faust app gets for this record."""
    message = SimpleNamespace(
        topic=rec.topic, partition=rec.partition, offset=rec.offset, key=rec.key, value=rec.value,
        headers=list(rec.headers.items()), timestamp=rec.timestamp_ms / 1000.0,
    )
    return SimpleNamespace(message=message, value=rec.value)


def worker_outcomes() -> tuple[Outcomes, FakeProducer]:
    producer = FakeProducer()
    outcomes = Outcomes(
        producer, lambda rec: None, TOPICS, FAUST_LIMITS, metrics=WorkerMetrics("toy", "adaptive"), pipeline="toy",
        fail=pytest.fail, carry_headers=TRACE_HEADERS, origin=ORIGIN,
    )
    return outcomes, producer


def faust_send(batch: FaustBatch, results: list[dict | None], errors: list[str | None]) -> list[Sent]:
    sent: list[Sent] = []
    outcomes = FaustOutcomes(
        FakeTopic(TOPICS.output, sent), dead_letter=FakeTopic(TOPICS.dead_letter, sent),
        late=FakeTopic(TOPICS.late, sent), origin=ORIGIN, carry_headers=TRACE_HEADERS,
    )
    asyncio.run(outcomes.send_batch(batch, MODEL, results, errors, TIMING))
    return sent


def faust_batch(items: list[Pending], rejected: Sequence[Rejected] = (), routed: Sequence[Pending] = ()) -> FaustBatch:
    return FaustBatch(items, "full", len(items), None, 0.0, TIMING.started_wall, False, list(rejected), list(routed))


def pending(
    rec: SourceRecord, prepared: Any = None, late_rule: str | None = None, deadline: float = DEADLINE
) -> Pending:
    return Pending(event(rec), prepared, 1, 0, 0.0, WALL + 1, rec.timestamp_ms, deadline, late_rule)


def worker_requests(records: list[SourceRecord]) -> list[Request]:
    codec = ToyCodec()
    return [
        Request(1, 0.0, 1.0, item=InFlight(rec, codec.decode(rec.value, rec.headers), DEADLINE, WALL + 1))
        for rec in records
    ]


def headers_of(sent: Sent) -> dict[str, bytes]:
    return dict(sent[3] or [])


def test_results_and_the_dead_letters_of_unpublishable_results_are_the_workers() -> None:
    records = [record(0, b"r0"), record(1, b"set"), record(2, b"huge")]
    requests = worker_requests(records)
    results, _ = toy_step().infer([r.item.decoded for r in requests])
    outcomes, producer = worker_outcomes()
    Publisher([], outcomes, OffsetTracker(), [], WorkerMetrics("toy", "adaptive"), "toy", "adaptive",
              WorkerStats(), Lifecycle(), pytest.fail).publish(requests, results, TIMING, MODEL)

    items = [pending(rec, req.item.decoded) for rec, req in zip(records, requests, strict=True)]
    faust = faust_send(faust_batch(items), list(results), [None] * 3)

    assert faust == producer.sent
    result, unserialisable, too_large = producer.sent
    assert result[0] == "scores" and result[3] == [("traceparent", records[0].headers["traceparent"])]
    assert headers_of(unserialisable)[H_ERROR].startswith(b"result cannot be serialised")
    assert b"over the 1000000-byte record limit of scores" in headers_of(too_large)[H_ERROR]
    assert {headers_of(s)[H_STAGE] for s in (unserialisable, too_large)} == {b"publish"}


def test_the_dead_letter_of_a_request_the_model_refuses_is_the_workers() -> None:
    rec = record(3, b"poison")
    (request,) = worker_requests([rec])
    step = toy_step()
    outcomes, producer = worker_outcomes()
    parts: list[Finished] = []
    queue = SimpleNamespace(done=lambda batch, seconds: None)
    Executors(queue, ModelSlot(step), lambda done: True, outcomes.dead_letter).run_batch(  # type: ignore[arg-type]
        step, Batch([request], 1, 0, "full", 0.0), parts)
    assert parts == []

    run = score_batch(step, [request.item.decoded])  # what BatchScorer.score runs
    assert run.singles is not None
    faust = faust_send(faust_batch([pending(rec, request.item.decoded)]),
                       [s.result for s in run.singles], [s.error for s in run.singles])

    assert faust == producer.sent
    (dead,) = producer.sent
    assert dead[0] == "requests.dlq" and headers_of(dead)[H_STAGE] == b"inference"
    assert headers_of(dead)[H_ERROR] == b"model rejected the request: RuntimeError: model refuses this input"


def test_the_dead_letters_of_input_its_codec_refuses_are_the_workers() -> None:
    records = [record(4, b"bad"), record(5, b"crash")]
    outcomes, producer = worker_outcomes()
    codec = ToyCodec()
    admission = Admission(codec, lambda priority: 60_000.0, outcomes, 1 << 30)  # type: ignore[arg-type]
    assert admission.admit(records, 0.0, WALL) == []

    rejected = []
    for rec in records:
        try:  # as the Faust driver's prepare() does
            codec.decode(rec.value, rec.headers)
        except Exception as exc:
            rejected.append(Rejected(event(rec), exc))
    faust = faust_send(faust_batch([], rejected=rejected), [], [])

    assert faust == producer.sent
    bad, crash = (headers_of(s) for s in producer.sent)
    assert bad[H_ERROR] == b"field 'x' is missing" and bad[H_STAGE] == b"decode"
    assert crash[H_ERROR] == b"decoder crashed: ZeroDivisionError: oops"


@pytest.mark.parametrize(("rule", "worker_rule"), [(RULE_SHED, RULE_SHED), (None, RULE_OVERDUE)])
def test_a_late_record_is_the_workers(rule: str | None, worker_rule: str) -> None:
    rec = record(6, b"r6")
    outcomes, producer = worker_outcomes()
    # What route_late (pipeline/worker/late_routing.py) hands over, RULE_OVERDUE where
    # the batcher named no rule.
    outcomes.late([(rec, WALL - 250.0)], TIMING.done_wall, worker_rule)

    faust = faust_send(faust_batch([], routed=[pending(rec, late_rule=rule, deadline=WALL - 250.0)]), [], [])

    assert faust == producer.sent
    (late,) = producer.sent
    assert late[0] == "requests.late" and headers_of(late)[H_LATE_RULE] == worker_rule.encode()
    assert headers_of(late)[H_DEADLINE_MISSED_BY] == b"259.0"
