"""Statistics derived from Prometheus samples: throughput, latency quantiles, mean
batch size, queue depth and lag per pipeline, over the interval between two snapshots.

The same arithmetic serves the worker's /api/stats (snapshots of its own registry) and
`tidebatch status` (snapshots of scraped /metrics text, merged over workers), so the
dashboard and the CLI can never disagree. Pure functions, no I/O.

Quantiles are computed like PromQL's histogram_quantile() on the bucket *deltas*
between the two snapshots, so they describe the recent window and not everything
since the worker started.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from prometheus_client.registry import CollectorRegistry

from pipeline.observe.metrics import OPTIONAL_STAGES, STAGES

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs
Samples = dict[str, dict[Labels, float]]  # sample name -> labels -> value

RECORDS = "tidebatch_records_total"
E2E = "tidebatch_end_to_end_latency_seconds"
STAGE = "tidebatch_stage_seconds"
BATCH_ROWS = "tidebatch_batch_rows"
QUEUE_ROWS = "tidebatch_queue_rows"
PIPELINE_LAG = "tidebatch_pipeline_lag_messages"
SLO = "tidebatch_slo_seconds"
ASSIGNED = "tidebatch_assigned_partitions"
READY = "tidebatch_ready"

# Gauges that mean the same on every worker: merging takes the max, not the sum.
# Shared, or each worker's own ratio (a tenant class's share used and served are per
# worker: each worker's gate holds the class's share of capacity_rows_per_s): max.
_MERGE_MAX = frozenset({SLO, "tidebatch_tenant_slo_seconds", "tidebatch_tenant_share_used",
                        "tidebatch_tenant_share_served"})


@dataclass(frozen=True)
class PipelineStats:
    """One pipeline over one window. None where the window has no data (no batch ran,
    no request finished): a chart shows a gap, not a misleading zero."""

    throughput_rps: float | None  # records that reached an outcome, per second
    rows_per_s: float | None  # model rows per second
    dlq_per_s: float | None
    p50_ms: float | None  # end-to-end latency (Kafka timestamp -> result produced)
    p99_ms: float | None
    slo_ms: float | None
    batch_rows: float | None  # mean rows per batch
    queue_rows: float
    lag: float | None  # messages, summed over partitions
    assigned: float  # partitions
    ready: float | None  # workers answering /readyz 200 (None: not exported)

    def as_dict(self) -> dict[str, float | None]:
        return {k: _round(v) for k, v in asdict(self).items()}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


# ----------------------------------------------------------------------------- snapshots
def _labels(d: Mapping[str, str]) -> Labels:
    return tuple(sorted(d.items()))


def from_families(families: Iterable) -> Samples:
    """Metric families (registry.collect() or the text parser) -> Samples."""
    out: Samples = {}
    for family in families:
        for s in family.samples:
            out.setdefault(s.name, {})[_labels(s.labels)] = float(s.value)
    return out


def from_registry(registry: CollectorRegistry) -> Samples:
    return from_families(registry.collect())


def from_text(text: str) -> Samples:
    """Prometheus text exposition format -> Samples."""
    from prometheus_client.parser import text_string_to_metric_families

    return from_families(text_string_to_metric_families(text))


def merge(snapshots: Iterable[Samples]) -> Samples:
    """Add up the snapshots of several workers: counters, histogram buckets and most
    gauges sum (partitions and queues are disjoint); the SLO is shared and a tenant
    class's share used or served is a worker's own ratio, so those take the max."""
    out: Samples = {}
    for snap in snapshots:
        for name, series in snap.items():
            target = out.setdefault(name, {})
            for labels, value in series.items():
                if labels in target:
                    prev = target[labels]
                    target[labels] = max(prev, value) if name in _MERGE_MAX else prev + value
                else:
                    target[labels] = value
    return out


def pipelines(samples: Samples) -> list[str]:
    """Every pipeline label value seen in the tidebatch_ samples."""
    names = {
        dict(labels)["pipeline"]
        for name, series in samples.items()
        if name.startswith("tidebatch_")
        for labels in series
        if "pipeline" in dict(labels)
    }
    return sorted(names)


# ----------------------------------------------------------------------------- arithmetic
def _series(samples: Samples, name: str, pipeline: str) -> dict[Labels, float]:
    return {
        labels: v
        for labels, v in samples.get(name, {}).items()
        if dict(labels).get("pipeline") == pipeline
    }


def _delta(
    old: Samples | None,
    new: Samples,
    name: str,
    pipeline: str,
    keep: Callable[[dict[str, str]], bool] = lambda _labels: True,
) -> float:
    """Increase of a counter-like sample summed over its label sets. A value that went
    down was reset (worker restart): like PromQL's increase(), count it from zero."""
    before = _series(old, name, pipeline) if old is not None else {}
    total = 0.0
    for labels, v in _series(new, name, pipeline).items():
        if not keep(dict(labels)):
            continue
        prev = before.get(labels, 0.0)
        total += v - prev if v >= prev else v
    return total


def _gauge_sum(samples: Samples, name: str, pipeline: str) -> float | None:
    series = _series(samples, name, pipeline)
    return sum(series.values()) if series else None


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """PromQL histogram_quantile() on cumulative (upper bound, count) pairs: linear
    interpolation inside the bucket holding the rank; the highest finite bound if the
    rank lands in +Inf; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def _bucket_deltas(
    old: Samples | None,
    new: Samples,
    name: str,
    pipeline: str,
    keep: Callable[[dict[str, str]], bool] = lambda _labels: True,
) -> list[tuple[float, float]]:
    per_le: dict[float, float] = {}
    before = _series(old, name + "_bucket", pipeline) if old is not None else {}
    for labels, v in _series(new, name + "_bucket", pipeline).items():
        if not keep(dict(labels)):
            continue
        le = float(dict(labels)["le"])
        prev = before.get(labels, 0.0)
        per_le[le] = per_le.get(le, 0.0) + (v - prev if v >= prev else v)
    return list(per_le.items())


def stage_breakdown(old: Samples | None, new: Samples, pipeline: str) -> dict[str, dict[str, float | None]]:
    """Where a scored request's time went between two snapshots (`old` None: since the
    worker started), by stage of tidebatch_stage_seconds in pipeline order: p50, p99
    and mean in ms, and how many requests each covers. An optional stage (to_broker:
    LogAppendTime topics only) is left out where it covers no request, so a CreateTime
    deployment's breakdown does not list a stage it can never have."""
    out: dict[str, dict[str, float | None]] = {}
    for stage in STAGES:
        def this(labels: dict[str, str], stage: str = stage) -> bool:
            return labels.get("stage") == stage

        count = _delta(old, new, STAGE + "_count", pipeline, this)
        if not count and stage in OPTIONAL_STAGES:
            continue
        total = _delta(old, new, STAGE + "_sum", pipeline, this)
        buckets = _bucket_deltas(old, new, STAGE, pipeline, this)
        p50, p99 = histogram_quantile(0.50, buckets), histogram_quantile(0.99, buckets)
        out[stage] = {
            "requests": count,
            "p50_ms": None if p50 is None else round(p50 * 1000.0, 2),
            "p99_ms": None if p99 is None else round(p99 * 1000.0, 2),
            "mean_ms": round(total / count * 1000.0, 2) if count else None,
        }
    return out


def window_stats(old: Samples | None, new: Samples, seconds: float) -> dict[str, PipelineStats]:
    """Per pipeline, what happened between snapshot `old` and snapshot `new`, taken
    `seconds` apart. Without `old`, rates and quantiles are None (one snapshot tells
    totals, not rates)."""
    out: dict[str, PipelineStats] = {}
    for p in pipelines(new):
        out[p] = _pipeline_stats(old, new, seconds, p)
    return out


def _rate(value: float, seconds: float, have_old: bool) -> float | None:
    return value / seconds if have_old and seconds > 0 else None


def _pipeline_stats(old: Samples | None, new: Samples, seconds: float, p: str) -> PipelineStats:
    have_old = old is not None
    records = _delta(old, new, RECORDS, p)
    dlq = _delta(old, new, RECORDS, p, lambda lb: lb.get("outcome") == "dlq")
    rows = _delta(old, new, BATCH_ROWS + "_sum", p)
    batches = _delta(old, new, BATCH_ROWS + "_count", p)
    latency = _bucket_deltas(old, new, E2E, p) if have_old else []
    p50 = histogram_quantile(0.50, latency)
    p99 = histogram_quantile(0.99, latency)
    slo = _gauge_sum(new, SLO, p)
    return PipelineStats(
        throughput_rps=_rate(records, seconds, have_old),
        rows_per_s=_rate(rows, seconds, have_old),
        dlq_per_s=_rate(dlq, seconds, have_old),
        p50_ms=None if p50 is None else p50 * 1000.0,
        p99_ms=None if p99 is None else p99 * 1000.0,
        slo_ms=None if slo is None else slo * 1000.0,
        batch_rows=rows / batches if have_old and batches > 0 else None,
        queue_rows=_gauge_sum(new, QUEUE_ROWS, p) or 0.0,
        lag=_gauge_sum(new, PIPELINE_LAG, p),
        assigned=_gauge_sum(new, ASSIGNED, p) or 0.0,
        ready=_gauge_sum(new, READY, p),
    )


# ----------------------------------------------------------------------------- verdicts
OK, DEGRADED, DOWN = "OK", "DEGRADED", "DOWN"


def lag_growing(old_lag: float | None, new: PipelineStats, min_lag: float = 100.0) -> bool:
    """Lag went up between the snapshots and is more than noise: above `min_lag`
    messages and above one second of throughput (a healthy pipeline under load always
    has a few in flight)."""
    if old_lag is None or new.lag is None or new.lag <= old_lag:
        return False
    floor = max(min_lag, new.throughput_rps or 0.0)
    return new.lag > floor


def verdict(stats: PipelineStats, growing: bool, workers_up: int) -> tuple[str, list[str]]:
    """OK / DEGRADED (p99 over the SLO, or lag growing) / DOWN (no worker answers, none
    is ready, or no partition is consumed), with the reasons."""
    if workers_up == 0:
        return DOWN, ["no worker answers"]
    if stats.ready is not None and stats.ready <= 0:
        return DOWN, ["no worker is ready"]
    if stats.assigned <= 0:
        return DOWN, ["no partition is assigned"]
    reasons = []
    if stats.p99_ms is not None and stats.slo_ms is not None and stats.p99_ms > stats.slo_ms:
        reasons.append(f"p99 {stats.p99_ms:.1f} ms over the {stats.slo_ms:g} ms SLO")
    if growing:
        reasons.append(f"lag growing ({stats.lag:.0f} messages)")
    return (DEGRADED, reasons) if reasons else (OK, [])
