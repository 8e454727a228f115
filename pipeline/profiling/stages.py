"""The worker's Python work per request, which shares one GIL whatever the model's
executor: admission on the source thread (pipeline/worker/admission.py: decoding,
deadlines; offsets tracked and requests queued as `Worker._admit` does), collate and split on the executor, the result document and its JSON on
the publisher (pipeline/worker/publisher.py). ONNX Runtime releases the GIL (or runs in
its own process), so a drain goes at the slower of this stage and the model's
(docs/OPERATIONS.md, "Capacity of one worker": JSON CTR requests fill the worker's core
with decoding at ~40 % of the model's peak). Timer passed in."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord
from pipeline.batching.concurrent import BatchQueue
from pipeline.clock import wall_ms
from pipeline.codecs.base import Codec, Decoded, decode_all
from pipeline.scoring import BatchTiming, result_document
from pipeline.worker.admission import Admission


@dataclass(frozen=True)
class PythonStage:
    """Seconds per request of each piece of the GIL-bound work, and rows per request."""

    admit_s: float  # the source thread's admission: decode, deadlines, offsets, queueing
    collate_split_s: float
    publish_s: float
    rows_per_request: float

    @property
    def per_request_s(self) -> float:
        return self.admit_s + self.collate_split_s + self.publish_s

    @property
    def capacity(self) -> float:
        """Rows/s if this stage alone limited the worker (one core's worth of GIL)."""
        return self.rows_per_request / self.per_request_s


def _median_per_item(timer: Callable[[], float], work: Callable[[], object], items: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = timer()
        work()
        times.append(timer() - t0)
    return statistics.median(times) / items


class _NoOutcomes:
    """Sample requests are valid and fresh: admission gives none a dead letter or a
    late record."""

    def dead_letter(self, rec: SourceRecord, reason: str, stage: str, *, error: object = None) -> None:
        raise AssertionError(f"a sample request was refused: {reason}")

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None:
        raise AssertionError(f"a sample request was routed late ({rule})")


def admit_all(admission: Admission, tracker: OffsetTracker, queue: BatchQueue, records: list[SourceRecord]) -> None:
    """What the worker's source thread does with a poll's records besides Kafka I/O
    (pipeline/worker/core.py `Worker._admit`): track the offsets, admit (decode, size
    and expiry checks, deadlines), queue."""
    tracker.track_many([(rec.tp, rec.offset) for rec in records])
    queue.put_many(admission.admit(records, time.monotonic(), wall_ms()))


def measure_python_stage(
    codec: Codec,
    model: Any,
    messages: Sequence[tuple[bytes | None, Mapping[str, bytes]]],
    run: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    batch_requests: int,
    timer: Callable[[], float],
    new_queue: Callable[[], BatchQueue],
    repeats: int = 5,
) -> PythonStage:
    """Time the GIL-bound work on `messages` (the pipeline's sample requests, all
    decodable): admit them as the source thread does into a fresh queue from
    `new_queue`, collate and split batches of `batch_requests`, and build and serialise
    their result documents. `run` is the model (its outputs feed split; its time is
    not counted here)."""
    decoded: list[Decoded] = [d for d in decode_all(codec, messages) if isinstance(d, Decoded)]
    n = len(decoded)
    now = wall_ms()  # fresh records: none expires while it is admitted
    records = [SourceRecord("profile", 0, i, None, value, dict(headers), now) for i, (value, headers) in
               enumerate(messages)]
    admissions = []
    for _ in range(repeats):  # built untimed: the worker builds them once
        admission = Admission(codec, lambda priority: 60_000.0, _NoOutcomes(), 1 << 30)
        admissions.append((admission, OffsetTracker(), new_queue()))
    fresh = iter(admissions)
    admit_s = _median_per_item(timer, lambda: admit_all(*next(fresh), records), len(messages), repeats)
    batches = [decoded[i : i + batch_requests] for i in range(0, n, batch_requests)]
    outputs = [run(codec.collate([d.payload for d in b])) for b in batches]

    def collate_split() -> None:
        for b, out in zip(batches, outputs, strict=True):
            codec.collate([d.payload for d in b])
            codec.split(out, b)

    results = [r for b, out in zip(batches, outputs, strict=True) for r in codec.split(out, b)]
    rec = SourceRecord("profile", 0, 0, b"key", b"", {}, 0)
    timing = BatchTiming(batch_requests, 0.001, 0, 1)

    def publish() -> None:
        for d, r in zip(decoded, results, strict=True):
            orjson.dumps(result_document(model, d, rec, r, timing, 0, 1.0))

    return PythonStage(
        admit_s=admit_s,
        collate_split_s=_median_per_item(timer, collate_split, n, repeats),
        publish_s=_median_per_item(timer, publish, n, repeats),
        rows_per_request=sum(d.rows for d in decoded) / n,
    )
