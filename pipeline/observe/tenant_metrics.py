"""Per-tenant-class metrics, read from the batcher's tenant gate (pipeline/batching/
tenants.py) at scrape time. Labelled by class (from the config), never by raw tenant
id: an unknown tenant is counted in `default`, so the series stay few whatever ids
producers send.

    tidebatch_tenant_rows_total{pipeline, tenant_class, colour}  rows admitted: green
        (within the share), yellow (over it), red (over the ceiling)
    tidebatch_tenant_shed_rows_total{pipeline, tenant_class}     rows shed to the late topic
    tidebatch_tenant_share_used{pipeline, tenant_class}          recent rate / guaranteed rate
    tidebatch_tenant_share_served{pipeline, tenant_class}        recent rows taken into batches /
        guaranteed rate: 1 or more, its guarantee met (a class over its share and served it
        yields within green, pipeline/batching/tenants.py tier_of)
    tidebatch_tenant_requests_total{pipeline, tenant_class, outcome}  one outcome per request
        the gate marked: ok (scored in time), late (scored late), routed_late (to the late
        topic unscored: expired, or shed over the ceiling); goodput = ok / all three
    tidebatch_tenant_latency_seconds{pipeline, tenant_class}     Kafka timestamp to result, for
        p99 against the class's SLA (histogram_quantile)
    tidebatch_tenant_slo_seconds{pipeline, tenant_class}         the class's budget (priority 0),
        for the alert TidebatchTenantP99OverSLA (ops/prometheus/alerts.yml)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pipeline.batching.tenants import COLOURS, TenantGate


class TenantCollector(Collector):
    def __init__(self, pipeline: str, gate: TenantGate, now: Callable[[], float]) -> None:
        self.pipeline, self.gate, self.now = pipeline, gate, now

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        rows = CounterMetricFamily(
            "tidebatch_tenant_rows", "Rows admitted per tenant class, by colour: green within its share, "
            "yellow over it, red over its ceiling", labels=["pipeline", "tenant_class", "colour"],
        )
        shed = CounterMetricFamily(
            "tidebatch_tenant_shed_rows", "Rows over a tenant class's ceiling shed to the late topic",
            labels=["pipeline", "tenant_class"],
        )
        used = GaugeMetricFamily(
            "tidebatch_tenant_share_used", "A tenant class's recent rate over its guaranteed rate "
            "(1: at its share); absent for classes without a share", labels=["pipeline", "tenant_class"],
        )
        served = GaugeMetricFamily(
            "tidebatch_tenant_share_served", "A tenant class's recent rows taken into batches over its "
            "guaranteed rate (1 or more: its guarantee met); absent for classes without a share",
            labels=["pipeline", "tenant_class"],
        )
        now = self.now()
        for name, c in sorted(self.gate.counters.items()):
            for colour in COLOURS:
                rows.add_metric([self.pipeline, name, colour], c.rows[colour])
            shed.add_metric([self.pipeline, name], c.shed_rows)
            for family, share in ((used, self.gate.share_used(name, now)), (served, self.gate.served_share(name, now))):
                if share is not None:
                    family.add_metric([self.pipeline, name], share)
        yield from (rows, shed, used, served)

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily("tidebatch_tenant_rows", "", labels=["pipeline", "tenant_class", "colour"])
        yield CounterMetricFamily("tidebatch_tenant_shed_rows", "", labels=["pipeline", "tenant_class"])
        yield GaugeMetricFamily("tidebatch_tenant_share_used", "", labels=["pipeline", "tenant_class"])
        yield GaugeMetricFamily("tidebatch_tenant_share_served", "", labels=["pipeline", "tenant_class"])


class TenantOutcomes:
    """What the publisher saw per class: scored requests by outcome, and their latency."""

    def __init__(
        self, registry: CollectorRegistry, pipeline: str, buckets: Sequence[float], slo_s: Mapping[str, float]
    ) -> None:
        self.pipeline = pipeline
        slo = Gauge(
            "tidebatch_tenant_slo_seconds", "Latency budget of a tenant class (priority 0), for p99 alerts",
            ["pipeline", "tenant_class"], registry=registry,
        )
        for name, seconds in slo_s.items():
            slo.labels(pipeline, name).set(seconds)
        self.requests = Counter(
            "tidebatch_tenant_requests", "Outcomes per tenant class: ok (scored in time), late (scored "
            "late), routed_late (unscored to the late topic: expired or shed)",
            ["pipeline", "tenant_class", "outcome"], registry=registry,
        )
        self.latency = Histogram(
            "tidebatch_tenant_latency_seconds", "Request Kafka timestamp to result produced, per tenant class",
            ["pipeline", "tenant_class"], buckets=buckets, registry=registry,
        )

    def routed(self, classes: Sequence[str]) -> None:
        """One per request routed unscored to the late topic, by its class."""
        for name in classes:
            self.requests.labels(self.pipeline, name, "routed_late").inc()

    def observe(self, scored: Sequence[tuple[str, bool, float | None]]) -> None:
        """(class, late, seconds from the Kafka timestamp or None) per scored request."""
        for name, late, seconds in scored:
            self.requests.labels(self.pipeline, name, "late" if late else "ok").inc()
            if seconds is not None:
                self.latency.labels(self.pipeline, name).observe(seconds)


def watch_tenants(
    registry: CollectorRegistry, pipeline: str, gate: TenantGate | None, now: Callable[[], float],
    buckets: Sequence[float] = (), slo_s: Mapping[str, float] | None = None,
) -> TenantOutcomes | None:
    """Export the gate's counters and return the publisher's per-class metrics; nothing
    without a gate (no `tenants:` section). slo_s: each class's budget in seconds."""
    if gate is None:
        return None
    registry.register(TenantCollector(pipeline, gate, now))
    return TenantOutcomes(registry, pipeline, buckets or Histogram.DEFAULT_BUCKETS, slo_s or {})
