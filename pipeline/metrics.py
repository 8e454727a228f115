"""Prometheus metrics of one worker. Names follow DESIGN.md: `tidebatch_` prefix, base
units, counters end in `_total`, low-cardinality labels (pipeline, topic, policy,
outcome, reason) — never a request id. Each worker owns a registry, so several
workers in one process (tests) do not collide."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

OUTCOMES = ("ok", "late", "dlq", "routed_late", "duplicate")

# Rows per batch: powers of two up to the largest batch anyone configures.
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Latencies from 0.5 ms to 30 s: CTR answers in milliseconds, a backlog in seconds.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class WorkerMetrics:
    def __init__(self, pipeline: str, policy: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.pipeline = pipeline
        self.policy = policy
        r = self.registry
        self.records = Counter(
            "tidebatch_records_total", "Consumed records by final outcome",
            ["pipeline", "topic", "outcome"], registry=r,
        )
        self.batches = Counter(
            "tidebatch_batches_total", "Batches run, by why the batch closed",
            ["pipeline", "policy", "reason"], registry=r,
        )
        self.batch_rows = Histogram(
            "tidebatch_batch_rows", "Rows per batch run by the model",
            ["pipeline", "policy"], buckets=_ROW_BUCKETS, registry=r,
        )
        self.queue_rows = Gauge(
            "tidebatch_queue_rows", "Rows waiting in the batch queue (in-time and late lanes)",
            ["pipeline"], registry=r,
        )
        self.queue_wait = Histogram(
            "tidebatch_queue_wait_seconds", "Time a request waited in the batch queue",
            ["pipeline"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.inference = Histogram(
            "tidebatch_inference_seconds", "Model run time per batch",
            ["pipeline"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "tidebatch_end_to_end_latency_seconds",
            "Request Kafka timestamp to result produced",
            ["pipeline"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.slo_misses = Counter(
            "tidebatch_slo_miss_total", "Requests answered after their deadline or routed late",
            ["pipeline"], registry=r,
        )
        self.lag = Gauge(
            "tidebatch_consumer_lag_messages",
            "High watermark minus position, per assigned partition",
            ["topic", "partition"], registry=r,
        )
        self.commits = Counter(
            "tidebatch_commits_total", "Offset commits", ["pipeline", "result"], registry=r,
        )
        self.pauses = Counter(
            "tidebatch_partition_pauses_total", "Backpressure pauses of the assigned partitions",
            ["pipeline"], registry=r,
        )
        self.paused = Gauge(
            "tidebatch_paused", "1 while the worker's partitions are paused by backpressure",
            ["pipeline"], registry=r,
        )
        self.assigned = Gauge(
            "tidebatch_assigned_partitions", "Partitions assigned to this worker",
            ["pipeline"], registry=r,
        )
        self.provider = Info(
            "tidebatch_model", "Model and the ONNX Runtime provider actually in use", registry=r,
        )
        self.delivery_errors = Counter(
            "tidebatch_delivery_errors_total", "Produce attempts that Kafka did not acknowledge",
            ["pipeline", "topic"], registry=r,
        )

    def outcome(self, topic: str, outcome: str, n: int = 1) -> None:
        self.records.labels(self.pipeline, topic, outcome).inc(n)
