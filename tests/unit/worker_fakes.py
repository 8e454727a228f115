"""Fakes for the worker's rooms (pipeline/worker/) without Kafka, shared by
tests/unit/test_worker_admission.py, test_worker_executors.py, test_worker_publisher.py
and test_tracing.py: a toy codec and model session, outcomes that only record, records,
batches, a publisher and a finished part. Clock readings are passed in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord
from models.registry import ModelSpec
from pipeline.batching.request import Batch, Request
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.stats import WorkerStats
from pipeline.observe.metrics import WorkerMetrics
from pipeline.worker.admission import InFlight
from pipeline.worker.executors import Finished
from pipeline.worker.publisher import Publisher

WALL = 1_700_000_000_000
MODEL = ModelSpec("toy", "1", Path("unused.onnx"), [], [], {})


class ToyCodec:
    """b"r<N>" decodes to a one-row request; b"bad" is invalid; b"crash" is a codec bug;
    b"poison" decodes but the model refuses it; b"d<ms>" carries its own deadline."""

    name = "toy"

    def __init__(self) -> None:
        self.decoded: list[bytes] = []

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        assert value is not None
        self.decoded.append(value)
        if value == b"bad":
            raise DecodeError("field 'x' is missing")
        if value == b"crash":
            raise ZeroDivisionError("oops")
        deadline = int(value[1:]) if value.startswith(b"d") else None
        return Decoded(request_id=value.decode(), rows=1, payload=value, deadline_ms=deadline)

    def collate(self, payloads: Sequence[Any], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        return {"x": np.array([p == b"poison" for p in payloads])}

    def split(self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]) -> list[dict]:
        return [{"score": float(i), "extra": d.extra.get("unserialisable", 0)} for i, d in enumerate(decoded)]


class ToySession:
    provider = "cpu"

    def run_timed(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        if feeds["x"].any():
            raise RuntimeError("model refuses this input\nsecond line of the ORT error")
        return {"y": feeds["x"]}, 0.001 * len(feeds["x"])


class FakeOutcomes:
    def __init__(self, limit: int = 10_000) -> None:
        self.dead: list[tuple[int, str, str]] = []
        self.routed: list[tuple[int, float]] = []
        self.rules: list[str] = []
        self.results: list[tuple[int, bytes]] = []
        self.ready: list[int | None] = []
        self.traces: list = []
        self.settled: list[int] = []
        self.limit = limit

    def settle(self, rec: SourceRecord) -> None:
        self.settled.append(rec.offset)

    def dead_letter(self, rec: SourceRecord, reason: str, stage: str, *, error: object = None) -> None:
        self.dead.append((rec.offset, reason, stage))

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None:
        self.routed += [(rec.offset, deadline) for rec, deadline in routed]
        self.rules += [rule] * len(routed)

    def result(self, rec: SourceRecord, value: bytes, ready_wall_ms: int | None = None, trace=None) -> None:
        self.results.append((rec.offset, value))
        self.ready.append(ready_wall_ms)
        self.traces.append(trace)

    def result_too_large(self, rec: SourceRecord, value: bytes) -> str | None:
        return f"result is {len(value)} bytes" if len(value) > self.limit else None


def record(offset: int, value: bytes, ts: int | None = WALL) -> SourceRecord:
    return SourceRecord("in", 0, offset, b"k", value, {}, ts)


def make_batch(values: list[bytes], seq: int = 0) -> Batch:
    requests = []
    for i, v in enumerate(values):
        d = Decoded(request_id=v.decode(), rows=1, payload=v)
        requests.append(Request(1, 0.0, 1.0, item=InFlight(record(i, v), d, WALL + 100.0, WALL)))
    return Batch(requests, len(requests), 0, "full", 0.0, seq=seq)


def publisher(outcomes: FakeOutcomes, tracker: OffsetTracker, hooks: list, stats: WorkerStats,
              metrics: WorkerMetrics | None = None, tracer=None) -> Publisher:
    failures: list[str] = []
    return Publisher(hooks, outcomes, tracker, [], metrics or WorkerMetrics("toy", "adaptive"), "toy",  # type: ignore[arg-type]
                     "adaptive", stats, Lifecycle(), failures.append, tracer)


def finished(batch: Batch, results: list[dict]) -> Finished:
    return Finished(batch, results, batch.rows, 0.004, WALL + 1, MODEL)
