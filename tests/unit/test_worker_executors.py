"""The worker's executors (pipeline/worker/executors.py) without Kafka, and the result
document they build (pipeline/scoring.py): a poison request isolated, a bug
dead-letters the batch; with a fake codec and model session
(tests/unit/worker_fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.batching.request import Batch
from pipeline.codecs.base import Decoded
from pipeline.scoring import BatchTiming, ScoringStep, result_document
from pipeline.versions.slot import ModelSlot
from pipeline.worker.executors import Done, Executors
from tests.unit.worker_fakes import MODEL, WALL, ToyCodec, ToySession, make_batch, record


class FakeQueue:
    def __init__(self, batches: list[Batch]) -> None:
        self.batches = list(batches)
        self.done_seconds: list[float] = []

    def get_batch(self) -> Batch | None:
        return self.batches.pop(0) if self.batches else None

    def done(self, batch: Batch, seconds: float) -> None:
        self.done_seconds.append(seconds)


def test_an_executor_scores_a_batch_and_isolates_a_poison_request() -> None:
    step = ScoringStep(MODEL, ToyCodec(), ToySession())  # type: ignore[arg-type]
    queue = FakeQueue([make_batch([b"r0", b"r1"], seq=0), make_batch([b"r0", b"poison", b"r2"], seq=1)])
    handed: list[Done] = []
    dead: list[tuple[int, str, str]] = []
    ex = Executors(queue, ModelSlot(step), lambda done: handed.append(done) or True,  # type: ignore[arg-type]
                   lambda rec, reason, stage: dead.append((rec.offset, reason, stage)))
    ex.loop()
    assert [d.seq for d in handed] == [0, 1]
    (whole,) = handed[0].parts
    assert whole.is_batch and whole.batch_rows == 2 and whole.seconds == pytest.approx(0.002)
    # The refused batch: its good requests scored alone, the poison one dead-lettered.
    assert [(p.is_batch, p.batch.requests[0].item.rec.offset) for p in handed[1].parts] == [(False, 0), (False, 2)]
    assert dead == [(1, "model rejected the request: RuntimeError: model refuses this input", "inference")]
    assert queue.done_seconds == [pytest.approx(0.002), 0.0]


def test_an_executor_that_hits_a_bug_dead_letters_the_batch_and_keeps_going() -> None:
    step = ScoringStep(MODEL, ToyCodec(), ToySession())  # type: ignore[arg-type]

    def broken_hook_step(decoded: Any, pad: Any = None) -> Any:
        raise AssertionError("a bug of ours")

    step.infer = broken_hook_step  # type: ignore[method-assign]
    step.one_by_one = lambda decoded: (_ for _ in ()).throw(KeyError("worse"))  # type: ignore[method-assign]
    queue = FakeQueue([make_batch([b"r0", b"r1"], seq=0), make_batch([b"r2"], seq=1)])
    handed: list[Done] = []
    dead: list[tuple[int, str, str]] = []
    ex = Executors(queue, ModelSlot(step), lambda done: handed.append(done) or True,  # type: ignore[arg-type]
                   lambda rec, reason, stage, error=None: dead.append((rec.offset, reason, stage)))
    ex.loop()
    assert [(d.seq, d.parts) for d in handed] == [(0, []), (1, [])]  # every number handed over
    assert [o for o, _, _ in dead] == [0, 1, 0]
    assert all(r == "internal error: KeyError: 'worse'" and s == "inference" for _, r, s in dead)


def test_the_result_document_is_the_same_for_the_worker_and_faust() -> None:
    d = Decoded(request_id="r7", rows=3, payload=None, priority=1, tenant="acme")
    rec = record(7, b"r7")
    doc = result_document(MODEL, d, rec, {"score": 0.5}, BatchTiming(12, 0.0021, WALL + 20, WALL + 25), WALL + 5, WALL + 24.0)
    assert doc == {
        "request_id": "r7", "score": 0.5, "key": "k", "model": "toy", "model_version": "1", "batch_rows": 12,
        "queue_wait_ms": 15, "inference_ms": 2.1, "kafka_ts_ms": WALL, "scored_at_ms": WALL + 25, "priority": 1,
        "late": True, "source": {"topic": "in", "partition": 0, "offset": 7}, "tenant": "acme",
    }
