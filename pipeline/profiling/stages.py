"""The worker's Python work per request, which shares one GIL whatever the model's
executor: decoding on the source thread (pipeline/worker/admission.py, through
`decode_all`), collate and split on the executor, the result document and its JSON on
the publisher (pipeline/worker/publisher.py). ONNX Runtime releases the GIL (or runs in
its own process), so a drain goes at the slower of this stage and the model's
(docs/OPERATIONS.md, "Capacity of one worker": JSON CTR requests fill the worker's core
with decoding at ~40 % of the model's peak). Timer passed in."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from consumers.records import SourceRecord
from pipeline.codecs.base import Codec, Decoded, decode_all
from pipeline.scoring import BatchTiming, result_document


@dataclass(frozen=True)
class PythonStage:
    """Seconds per request of each piece of the GIL-bound work, and rows per request."""

    decode_s: float
    collate_split_s: float
    publish_s: float
    rows_per_request: float

    @property
    def per_request_s(self) -> float:
        return self.decode_s + self.collate_split_s + self.publish_s

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


def measure_python_stage(
    codec: Codec,
    model: Any,
    messages: Sequence[tuple[bytes | None, Mapping[str, bytes]]],
    run: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    batch_requests: int,
    timer: Callable[[], float],
    repeats: int = 5,
) -> PythonStage:
    """Time the GIL-bound work on `messages` (a poll's worth of the pipeline's sample
    requests, all decodable): decode them, collate and split batches of
    `batch_requests`, and build and serialise their result documents. `run` is the
    model (its outputs feed split; its time is not counted here)."""
    decoded: list[Decoded] = [d for d in decode_all(codec, messages) if isinstance(d, Decoded)]
    n = len(decoded)
    decode_s = _median_per_item(timer, lambda: decode_all(codec, messages), len(messages), repeats)
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
        decode_s=decode_s,
        collate_split_s=_median_per_item(timer, collate_split, n, repeats),
        publish_s=_median_per_item(timer, publish, n, repeats),
        rows_per_request=sum(d.rows for d in decoded) / n,
    )
