"""Prometheus metrics of one worker. Names follow docs/OPERATIONS.md ("Metrics"):
`tidebatch_` prefix, base units, counters end in `_total`, low-cardinality labels
(pipeline, topic, policy, outcome, reason) — never a request id. Each worker owns a
registry, so several workers in one process (tests) do not collide."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pipeline.observe.tenant_metrics import TenantOutcomes

OUTCOMES = ("ok", "late", "dlq", "routed_late", "duplicate")
# Where a scored request's time goes, in order; from to_worker on they add up to Kafka
# timestamp → result acknowledged (docs/OPERATIONS.md, "Where the time goes").
# to_broker (produce() → the broker's append) is observed only for requests on a
# LogAppendTime topic that carry the producer's tidebatch.produced_ms header
# (consumers/records.py); then the Kafka timestamp is the append and to_broker comes
# before it.
STAGES = ("to_broker", "to_worker", "decode", "queue", "model", "publish")
# Stages that only some deployments observe: left out of a breakdown that has none.
OPTIONAL_STAGES = frozenset({"to_broker"})

# Rows per batch: powers of two up to the largest batch anyone configures.
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# Latencies from 0.5 ms to 30 s: CTR answers in milliseconds, a backlog in seconds.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
)
LATENCY_BUCKETS = _LATENCY_BUCKETS  # also the per-tenant latency's (tenant_metrics.py)


def observe_many(histogram: Any, values: Sequence[float]) -> None:
    """Histogram.observe for each value, with one lock round per bucket touched.

    The publisher observes two latencies per request; prometheus_client's observe()
    scans the buckets in Python and takes a lock per call, a few microseconds per
    request on the worker's busiest path. This counts a batch's values per bucket
    with numpy instead. It uses the client's internals (the per-bucket counts behind
    observe()), so it falls back to observe() where they are not as expected."""
    if not len(values):
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for v in values:
            histogram.observe(v)
        return
    if len(values) <= FEW_VALUES:
        _observe_few(bounds, buckets, total, values)
        return
    arr = np.asarray(values, dtype=np.float64)
    # observe() counts a value in the first bucket whose bound is >= it (side="left");
    # the last bound is +Inf, so NaN alone can fall past it, as observe() drops it.
    where = np.searchsorted(np.asarray(bounds, dtype=np.float64), arr, side="left")
    counts = np.bincount(where, minlength=len(bounds) + 1)
    total.inc(float(arr.sum()))
    for i in np.flatnonzero(counts[: len(bounds)]):
        buckets[i].inc(int(counts[i]))


# Below this many values a bisect per value beats numpy's ~8 us of calls per batch: a
# drain's batches hold ~13 CTR requests (~260 rows) and the publisher observes seven
# histograms per batch, about 4 us a request that way (docs/PEERS.md, "Per-request
# Python, issue 46").
FEW_VALUES = 40


def _observe_few(bounds: Sequence[float], buckets: Sequence[Any], total: Any, values: Sequence[float]) -> None:
    """observe_many's counting for a few values, in Python: the same buckets as
    np.searchsorted(side="left"), NaN past the last bound (counted in the sum only)."""
    touched: dict[int, int] = {}
    for v in values:
        i = bisect_left(bounds, v) if v == v else len(bounds)
        touched[i] = touched.get(i, 0) + 1
    total.inc(float(sum(values)))
    for i in sorted(touched):
        if i < len(bounds):
            buckets[i].inc(touched[i])


class BatchingMetrics:
    """What any path through the batching core exports: the worker and the Faust
    helper (pipeline/faust/driver.py) share these names, labels and buckets, so one
    set of dashboards and alerts reads both."""

    def __init__(self, pipeline: str, policy: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.pipeline = pipeline
        self.policy = policy
        r = self.registry
        self.records = Counter(
            "tidebatch_records_total", "Consumed records by final outcome",
            ["pipeline", "topic", "outcome"], registry=r,
        )
        self._outcomes: dict[tuple[str, str], Any] = {}  # outcome(): (topic, outcome) -> records' child
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
        self.stage = Histogram(
            "tidebatch_stage_seconds",
            "A scored request's time by stage: to_broker (the producer's produce() call to the broker's "
            "append; only for LogAppendTime topics with a tidebatch.produced_ms header), "
            "to_worker (Kafka timestamp to consumed), "
            "decode (consumed to its poll decoded), queue (decoded until its batch started), "
            "model (its batch's model time), publish (results ready to the result acknowledged)",
            ["pipeline", "stage"], buckets=_LATENCY_BUCKETS, registry=r,
        )

    def outcome(self, topic: str, outcome: str, n: int = 1) -> None:
        # The child looked up once per (topic, outcome): labels() takes a lock and checks
        # its arguments, and the publisher counts outcomes for every batch. Any thread:
        # two racing lookups get the same child from prometheus_client.
        child = self._outcomes.get((topic, outcome))
        if child is None:
            child = self._outcomes[(topic, outcome)] = self.records.labels(self.pipeline, topic, outcome)
        child.inc(n)


class WorkerMetrics(BatchingMetrics):
    """A worker's metrics: the batching core's plus Kafka-side ones (lag, commits,
    pauses, assignment) and the model/provider in use."""

    def __init__(self, pipeline: str, policy: str, registry: CollectorRegistry | None = None) -> None:
        super().__init__(pipeline, policy, registry)
        r = self.registry
        self.slo_misses = Counter(
            "tidebatch_slo_miss_total", "Requests answered after their deadline or routed late",
            ["pipeline"], registry=r,
        )
        self.routed_late = Counter(
            "tidebatch_routed_late_total",
            "Requests routed unscored to the late topic, by the rule that routed them: expired "
            "(before decoding, past its deadline), shed (before decoding, too old to keep the "
            "reserve), overdue (in the queue, past its deadline less the answer tail), hopeless "
            "(in the queue, predicted to miss that), over_ceiling (tenant class)",
            ["pipeline", "rule"], registry=r,
        )
        # Exported by _LagCollector with its sum, not by the registry on its own.
        self.lag = Gauge(
            "tidebatch_consumer_lag_messages",
            "High watermark minus position, per assigned partition",
            ["topic", "partition"], registry=None,
        )
        self.last_commit = Gauge(
            "tidebatch_last_commit_timestamp_seconds",
            "Unix time of the last successful offset commit (the worker's start until the first)",
            ["pipeline"], registry=r,
        )
        # Starts at process start so that "no commit for N seconds" also fires for a
        # worker that never managed a first commit.
        self.last_commit.labels(pipeline).set_to_current_time()
        self.commits = _CommitCounter(
            Counter("tidebatch_commits_total", "Offset commits", ["pipeline", "result"], registry=r),
            self.last_commit,
        )
        self.pauses = Counter(
            "tidebatch_partition_pauses_total", "Backpressure episodes: the queue reached its high watermark",
            ["pipeline"], registry=r,
        )
        self.paused = Gauge(
            "tidebatch_paused", "1 while backpressure holds or pauses the worker's intake",
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
        # pipeline/delivery/kafka_progress.py: results or commits held up past outage_after_s.
        self.outage = Gauge(
            "tidebatch_kafka_outage", "1 while the worker's writes to Kafka are held up (an outage)",
            ["pipeline"], registry=r,
        )
        self.outages = Counter(
            "tidebatch_kafka_outages_total", "Outages the worker saw begin", ["pipeline"], registry=r,
        )
        # consumers/broker_connections.py, from the consumer's librdkafka statistics.
        self.broker_connects = Counter(
            "tidebatch_broker_connects_total", "Connections to brokers made (the consumer's)", ["pipeline"], registry=r,
        )
        self.broker_disconnects = Counter(
            "tidebatch_broker_disconnects_total", "Connections to brokers lost (the consumer's)", ["pipeline"],
            registry=r,
        )
        self.brokers_up = Gauge(
            "tidebatch_brokers_up", "Brokers the consumer has a connection to now", ["pipeline"], registry=r,
        )
        # delivery exactly_once (pipeline/delivery/transactions.py): how long a commit
        # (producer and sink flush, offsets, EndTxn) holds the source loop; aborts count
        # as commits{result="aborted"}.
        self.transaction_seconds = Histogram(
            "tidebatch_transaction_commit_seconds",
            "Time the source loop stands still to commit a transaction (flushes, offsets, EndTxn)",
            ["pipeline"], buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r,
        )
        self.model_restarts = Counter(
            "tidebatch_model_process_restarts_total",
            "Times the model process died and a new one was started, or tried to (runtime.model_process)",
            ["pipeline"], registry=r,
        )
        # Model versions (pipeline/versions/): what each served, and loads refused.
        self.model_loads = Counter(
            "tidebatch_model_loads_total",
            "New model versions loaded and swapped in (outcome loaded) or refused (outcome refused)",
            ["pipeline", "outcome"], registry=r,
        )
        self.version_requests = Counter(
            "tidebatch_model_version_requests_total", "Requests scored, by the model version that scored them",
            ["pipeline", "model_version"], registry=r,
        )

        self.slo = Gauge(
            "tidebatch_slo_seconds", "Latency budget of a request (batching.slo_ms), for p99 alerts",
            ["pipeline"], registry=r,
        )
        self.ready = Gauge(
            "tidebatch_ready", "1 while /readyz answers 200 (partitions assigned, model loaded, broker polled)",
            ["pipeline"], registry=r,
        )
        # Per tenant class, set by compose.py with a `tenants:` section (tenant_metrics.py).
        self.tenants: TenantOutcomes | None = None
        # The per-partition lag gauge has no pipeline label (pipeline/delivery/partitions.py sets it by topic and
        # partition); dashboards and alerts group by pipeline, so also export the sum.
        r.register(_LagCollector(self))



class _StampingChild:
    """A tidebatch_commits_total child that also stamps tidebatch_last_commit_timestamp_seconds."""

    def __init__(self, child: Any, stamp: Any) -> None:
        self._child = child
        self._stamp = stamp

    def inc(self, amount: float = 1) -> None:
        self._child.inc(amount)
        self._stamp.set_to_current_time()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._child, name)


class _CommitCounter:
    """tidebatch_commits_total, with .labels(pipeline, result) as on a Counter. A
    result="ok" increment also records its time: the alert "no commit for N seconds"
    needs a timestamp, and a counter that never moved has no series to alert on."""

    def __init__(self, counter: Counter, last_commit: Gauge) -> None:
        self._counter = counter
        self._last_commit = last_commit

    def labels(self, *values: str, **kw: str) -> Any:
        child = self._counter.labels(*values, **kw)
        named = dict(zip(("pipeline", "result"), values, strict=False)) | kw
        if named.get("result") != "ok":
            return child
        return _StampingChild(child, self._last_commit.labels(named["pipeline"]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._counter, name)


class _LagCollector(Collector):
    """tidebatch_consumer_lag_messages{topic,partition} and its sum,
    tidebatch_pipeline_lag_messages{pipeline}, from one reading of the per-partition
    gauge, so one scrape never shows them apart. Two readings (the gauge registered on
    its own, the sum read again later in the scrape) disagreed while the source thread
    updated the lag between them: 3540 against 1134 in a CI run
    (tests/integration/test_lag_metric.py; tests/unit/test_metrics_lag.py)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        families = list(self._metrics.lag.collect())
        yield from families
        family = GaugeMetricFamily(
            "tidebatch_pipeline_lag_messages",
            "Consumer lag summed over the partitions assigned to this worker",
            labels=["pipeline"],
        )
        family.add_metric([self._metrics.pipeline], sum(s.value for f in families for s in f.samples))
        yield family

    def describe(self) -> Iterator[Metric]:
        # Without describe() the registry would call collect() at registration time,
        # before self.lag exists on a half-built WorkerMetrics.
        yield GaugeMetricFamily("tidebatch_consumer_lag_messages", "", labels=["topic", "partition"])
        yield GaugeMetricFamily("tidebatch_pipeline_lag_messages", "", labels=["pipeline"])
