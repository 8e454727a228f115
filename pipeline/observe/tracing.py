"""OpenTelemetry spans of each request's way through the worker, and one span per
batch linked to the requests it carried (config `tracing`; the optional `otel`
extra: `pip install 'tidebatch[otel]'`).

A request whose record has a W3C `traceparent` header gets its span in that trace;
one without starts a trace of its own. The request span runs from the record's
Kafka timestamp to the moment its result was ready, with three child spans that
match tidebatch_stage_seconds (docs/OPERATIONS.md, "Where the time goes"):
`to_worker`, `queue` and `model`; the batch span runs as long as the model did and
links every request span, so a trace viewer shows who shared the batch. The result
record's `traceparent` is then the request span's, so whatever consumes results goes
on in the same trace.

Spans are made after the fact with the times the publisher already has
(pipeline/worker/publisher.py), so tracing adds no clock reads to the hot path and
nothing at all when it is off. Exporting is the SDK's: `otlp` (HTTP/protobuf to
OTEL_EXPORTER_OTLP_ENDPOINT, the standard variables apply), `console`, or `none`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from consumers.records import SourceRecord

EXPORTERS = ("otlp", "console", "none")
# The W3C trace context: the request headers a result carries by default (config
# `result_headers`, pipeline/delivery/outcomes.py), so a trace a producer started goes on past
# the worker even with tracing off.
TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
_TRACE_HEADERS = ("traceparent", "tracestate")


@dataclass
class TracingConfig:
    enabled: bool = False
    service_name: str = "tidebatch"
    exporter: str = "otlp"  # otlp, console, none


def validate_tracing(tc: TracingConfig, bad: Callable[[str, str], Exception]) -> None:
    if tc.exporter not in EXPORTERS:
        raise bad("tracing.exporter", f"{tc.exporter!r} is not one of {', '.join(EXPORTERS)}")
    if not tc.service_name:
        raise bad("tracing.service_name", "must not be empty")


@dataclass(frozen=True)
class RequestTrace:
    """What the publisher needs back for one request: the span (for the batch's
    links) and the headers its result carries."""

    span: Any
    headers: list[tuple[str, bytes]]


class BatchTracer:
    """Makes the spans of published requests and their batch. Thread-safe as the SDK
    is; called from the publisher thread only."""

    def __init__(self, provider: Any, pipeline: str) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = provider
        self._tracer = provider.get_tracer("tidebatch")
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._pipeline = pipeline

    def request(self, rec: SourceRecord, consumed_wall_ms: int, started_wall_ms: int,
                model_end_wall_ms: int) -> RequestTrace:
        carrier = {k: v.decode("latin-1") for k, v in rec.headers.items() if k in _TRACE_HEADERS}
        parent = self._propagator.extract(carrier) if carrier else None
        begin = rec.timestamp_ms if rec.timestamp_ms is not None else consumed_wall_ms
        span = self._tracer.start_span(
            "tidebatch.request", context=parent, kind=self._trace.SpanKind.CONSUMER, start_time=_ns(begin),
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": rec.topic,
                "messaging.destination.partition.id": str(rec.partition),
                "messaging.kafka.offset": rec.offset,
                "tidebatch.pipeline": self._pipeline,
            },
        )
        inside = self._trace.set_span_in_context(span)
        for name, start, end in (
            ("to_worker", begin, consumed_wall_ms),
            ("queue", consumed_wall_ms, started_wall_ms),
            ("model", started_wall_ms, model_end_wall_ms),
        ):
            self._tracer.start_span(name, context=inside, start_time=_ns(start)).end(end_time=_ns(max(end, start)))
        span.end(end_time=_ns(max(model_end_wall_ms, begin)))
        out: dict[str, str] = {}
        self._propagator.inject(out, context=inside)
        return RequestTrace(span, [(k, v.encode()) for k, v in out.items()])

    def batch(self, requests: Sequence[RequestTrace], rows: int, started_wall_ms: int, model_end_wall_ms: int) -> None:
        from opentelemetry.trace import Link

        if not requests:
            return
        span = self._tracer.start_span(
            "tidebatch.batch", start_time=_ns(started_wall_ms),
            links=[Link(r.span.get_span_context()) for r in requests],
            attributes={"tidebatch.pipeline": self._pipeline, "tidebatch.batch.requests": len(requests),
                        "tidebatch.batch.rows": rows},
        )
        span.end(end_time=_ns(max(model_end_wall_ms, started_wall_ms)))

    def close(self) -> None:
        """Export what is buffered (worker shutdown)."""
        self._provider.shutdown()


def _ns(wall_ms: int | float) -> int:
    return int(wall_ms * 1_000_000)


def make_tracer(tc: TracingConfig, pipeline: str, exporter: Any = None) -> BatchTracer | None:
    """The worker's tracer, None when tracing is off. `exporter`: a span exporter of
    the caller's (tests: the SDK's InMemorySpanExporter, exported at once)."""
    if not tc.enabled:
        return None
    from pipeline.errors import UserError
    from pipeline.extras import missing

    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
    except ImportError:
        raise missing("otel") from None
    # Not the global provider: a worker's spans stay its own (tests run several).
    provider = TracerProvider(resource=Resource.create({"service.name": tc.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif tc.exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise UserError("tracing.exporter otlp needs opentelemetry-exporter-otlp-proto-http: "
                            "pip install 'tidebatch[otel]'") from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif tc.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return BatchTracer(provider, pipeline)
