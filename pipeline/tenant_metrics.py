"""Per-tenant-class metrics, read from the batcher's tenant gate (pipeline/batching/
tenants.py) at scrape time. Labelled by class (from the config), never by raw tenant
id: an unknown tenant is counted in `default`, so the series stay few whatever ids
producers send.

    tidebatch_tenant_rows_total{pipeline, tenant_class, colour}  rows admitted: green
        (within the share), yellow (over it), red (over the ceiling)
    tidebatch_tenant_shed_rows_total{pipeline, tenant_class}     rows shed to the late topic
    tidebatch_tenant_share_used{pipeline, tenant_class}          recent rate / guaranteed rate
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
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
        now = self.now()
        for name, c in sorted(self.gate.counters.items()):
            for colour in COLOURS:
                rows.add_metric([self.pipeline, name, colour], c.rows[colour])
            shed.add_metric([self.pipeline, name], c.shed_rows)
            share = self.gate.share_used(name, now)
            if share is not None:
                used.add_metric([self.pipeline, name], share)
        yield from (rows, shed, used)

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily("tidebatch_tenant_rows", "", labels=["pipeline", "tenant_class", "colour"])
        yield CounterMetricFamily("tidebatch_tenant_shed_rows", "", labels=["pipeline", "tenant_class"])
        yield GaugeMetricFamily("tidebatch_tenant_share_used", "", labels=["pipeline", "tenant_class"])


def watch_tenants(registry: CollectorRegistry, pipeline: str, gate: TenantGate | None, now: Callable[[], float]) -> None:
    """Export the gate's counters; nothing without a gate (no `tenants:` section)."""
    if gate is not None:
        registry.register(TenantCollector(pipeline, gate, now))
