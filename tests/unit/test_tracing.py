"""OpenTelemetry spans (pipeline/observe/tracing.py) made by the publisher from the times it
already has: a request span in the producer's trace with to_worker / queue / model
children, a batch span linking its requests, and the result's traceparent naming the
request span. The SDK's in-memory exporter; no network."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from consumers.offsets import OffsetTracker  # noqa: E402
from pipeline.config import load_config  # noqa: E402
from pipeline.delivery.stats import WorkerStats  # noqa: E402
from pipeline.errors import UserError  # noqa: E402
from pipeline.observe.tracing import TracingConfig, make_tracer  # noqa: E402
from pipeline.scoring import BatchTiming  # noqa: E402
from tests.unit.worker_fakes import MODEL, WALL, FakeOutcomes, make_batch, publisher  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()


def test_spans_follow_the_request_through_the_worker_and_the_batch_links_them() -> None:
    exporter = InMemorySpanExporter()
    tracer = make_tracer(TracingConfig(enabled=True), "toy", exporter=exporter)
    outcomes = FakeOutcomes()
    pub = publisher(outcomes, OffsetTracker(), [], WorkerStats(), tracer=tracer)
    batch = make_batch([b"r0", b"r1"])  # Kafka timestamps WALL, consumed at WALL
    batch.requests[0].item.rec.headers["traceparent"] = PARENT  # r1 has none: a trace of its own
    batch.requests[1].item.consumed_wall_ms = WALL + 40
    pub.publish(batch.requests, [{"score": 0.0}, {"score": 1.0}], BatchTiming(2, 0.004, WALL + 50, WALL + 55), MODEL)

    spans = {(s.name, s.context.trace_id): s for s in exporter.get_finished_spans()}
    requests = [s for (name, _), s in spans.items() if name == "tidebatch.request"]
    assert len(requests) == 2
    first = next(s for s in requests if f"{s.context.trace_id:032x}" == TRACE_ID)
    assert first.parent.span_id == 0x00F067AA0BA902B7  # a child of the producer's span
    assert first.start_time == WALL * 1_000_000 and first.end_time == (WALL + 54) * 1_000_000
    assert first.attributes["messaging.destination.name"] == "in"
    children = {s.name: s for s in exporter.get_finished_spans() if s.parent is not None
                and s.parent.span_id == first.context.span_id}
    assert set(children) == {"to_worker", "queue", "model"}
    assert (children["queue"].start_time, children["queue"].end_time) == (WALL * 10**6, (WALL + 50) * 10**6)
    [batch_span] = [s for s in exporter.get_finished_spans() if s.name == "tidebatch.batch"]
    assert {link.context.span_id for link in batch_span.links} == {s.context.span_id for s in requests}
    assert batch_span.attributes["tidebatch.batch.rows"] == 2
    # The result goes on in the same trace, as a child of the worker's request span.
    headers = dict(outcomes.traces[0])
    assert headers["traceparent"] == f"00-{TRACE_ID}-{first.context.span_id:016x}-01".encode()


def test_tracing_off_makes_no_tracer_and_a_bad_exporter_is_one_line() -> None:
    assert make_tracer(TracingConfig(), "toy") is None
    with pytest.raises(UserError, match="config key 'tracing.exporter': 'jaeger' is not one of otlp, console, none"):
        load_config(environ={"TIDEBATCH_TRACING__EXPORTER": "jaeger"})
