"""Prometheus metrics of the Redis integration, added to a worker's own registry
(pipeline/observe/metrics.py keeps its names; these live beside them). No pipeline label: one
worker process talks to one Redis, and Prometheus adds job/instance itself."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FEATURE_KINDS = ("user", "item")
# 50 us (one local round trip) to 0.25 s (a socket timeout and then some)
_LOOKUP_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


@dataclass(frozen=True)
class RedisMetrics:
    up: Gauge
    errors: Counter
    outages: Counter
    feature_lookups: Counter
    feature_misses: Counter
    feature_unavailable: Counter
    feature_invalid: Counter
    feature_lookup_seconds: Histogram
    store_written: Counter
    store_dropped: Counter
    store_buffered: Gauge
    dedup_skipped: Counter


def register_redis_metrics(registry: CollectorRegistry) -> RedisMetrics:
    """Create the Redis metrics in `registry` (a worker's: worker.metrics.registry)."""
    r = registry
    m = RedisMetrics(
        up=Gauge("tidebatch_redis_up", "1 while Redis answers, 0 during an outage", registry=r),
        errors=Counter(
            "tidebatch_redis_errors_total", "Redis calls that failed (connection, timeout, error reply)",
            ["op"], registry=r,
        ),
        outages=Counter("tidebatch_redis_outages_total", "Times Redis became unreachable", registry=r),
        feature_lookups=Counter(
            "tidebatch_feature_lookups_total", "Feature keys looked up in Redis (deduplicated per batch)",
            ["kind"], registry=r,
        ),
        feature_misses=Counter(
            "tidebatch_feature_misses_total", "Feature keys absent from Redis (defaults used)",
            ["kind"], registry=r,
        ),
        feature_unavailable=Counter(
            "tidebatch_feature_unavailable_total",
            "Feature keys not looked up because Redis was unavailable (defaults used)",
            ["kind"], registry=r,
        ),
        feature_invalid=Counter(
            "tidebatch_feature_invalid_total", "Stored feature values that could not be parsed (treated as missing)",
            ["kind"], registry=r,
        ),
        feature_lookup_seconds=Histogram(
            "tidebatch_feature_lookup_seconds",
            "Time a batch spent getting its store features (Redis round trip + featurising)",
            buckets=_LOOKUP_BUCKETS, registry=r,
        ),
        store_written=Counter(
            "tidebatch_redis_store_written_total", "Results written to the online score store", registry=r,
        ),
        store_dropped=Counter(
            "tidebatch_redis_store_dropped_total",
            "Results dropped from the score store's retry buffer (full during an outage)", registry=r,
        ),
        store_buffered=Gauge(
            "tidebatch_redis_store_buffered", "Results waiting to be written to the score store", registry=r,
        ),
        dedup_skipped=Counter(
            "tidebatch_redis_dedup_skipped_total",
            "Results published without a replay check because Redis was unavailable", registry=r,
        ),
    )
    m.up.set(0)
    for kind in FEATURE_KINDS:  # export zeros, so rate() works from the first scrape
        for counter in (m.feature_lookups, m.feature_misses, m.feature_unavailable, m.feature_invalid):
            counter.labels(kind)
    return m
