"""Adaptive micro-batches inside Faust agents, driven by the same batching core as the
worker (pipeline/batching: policy + cost model + late lane)::

    @app.agent(requests)
    async def score(stream):
        async for batch in adaptive_batches(stream, policy="adaptive", slo_ms=100,
                                            max_batch_rows=512, rows=lambda v: 1):
            await do_something(batch.values)      # the batch body

Each event's deadline is its Kafka timestamp plus the SLO; an event is acknowledged
only after the body of its batch succeeded, in offset order per partition, so a body
that raises leaves its events to be processed again after a restart (at-least-once).

This module is the public entry point: ``adaptive_batches`` is defined here and every
other public name is re-exported from where it lives:

- pipeline/faust/core.py: ``BatchingCore``, ``make_core``, ``Pending`` (pure; clock passed in);
- pipeline/faust/acks.py: ``AckGate``, ``ack_gate_for`` (acks in offset order; pure);
- pipeline/faust/batch.py: ``FaustBatch``, ``Rejected``, the no-model-work reasons;
- pipeline/faust/driver.py: ``AdaptiveBatches``, the asyncio driver over a Faust stream;
- pipeline/faust/events.py: what the driver reads off a Faust event.

Faust is never imported, so the core and its tests run without Faust installed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from pipeline.batching.cost import CostModel
from pipeline.clock import Clock, MonotonicClock, wall_ms
from pipeline.config.tenants import TenantsConfig
from pipeline.faust.acks import AckGate, PartitionKey, ack_gate_for
from pipeline.faust.batch import REASON_REJECTED, REASON_ROUTED_LATE, FaustBatch, Rejected
from pipeline.faust.core import BatchingCore, Pending, make_core
from pipeline.faust.driver import AdaptiveBatches, BatchMetrics, PrepareFn
from pipeline.observe.metrics import LATENCY_BUCKETS
from pipeline.observe.tenant_metrics import watch_tenants


def adaptive_batches(
    stream: Any,
    policy: str = "adaptive",
    slo_ms: float = 100.0,
    max_batch_rows: int = 512,
    rows: Callable[[Any], int] | None = None,
    *,
    prepare: PrepareFn | None = None,
    priority: Callable[[Any], int] | None = None,
    bucket: Callable[[Any], Hashable] | None = None,
    deadline_ms: Callable[[Any], float | None] | None = None,
    tenant: Callable[[Any], str | None] | None = None,
    tenants: TenantsConfig | Mapping[str, Any] | None = None,
    max_queue_delay_ms: float = 10.0,
    policy_params: dict[str, Any] | None = None,
    cost_model: CostModel | None = None,
    expiry_action: str = "score_late",
    late_share: float = 0.05,
    allowed_batch_sizes: Sequence[int] | None = None,
    max_queued_rows: int = 20_000,
    max_pending_acks: int = 16,
    metrics: BatchMetrics | None = None,
    clock: Clock | None = None,
    wall_clock_ms: Callable[[], int] = wall_ms,
) -> AdaptiveBatches:
    """Adaptive batches of a Faust agent's stream; use as ``async for batch in ...``.

    rows/priority/bucket/deadline_ms are functions of the event's value -- or of what
    ``prepare(event)`` returned when ``prepare`` is given (e.g. a codec's decode: then
    the defaults read ``.rows``, ``.priority``, ``.bucket`` and ``.deadline_ms`` of
    the prepared object, which is what ``pipeline.codecs`` Decoded carries). An event
    whose prepare() raises is passed to the body in ``batch.rejected``.

    ``cost_model`` seeds what a batch costs (e.g. from a warm-up profile); it then
    learns from every body's time. Policies and their parameters are the worker's
    (docs/BATCHING.md); ``max_queued_rows`` bounds the rows held here (backpressure).

    ``tenants``: a worker config's `tenants` section (``load_config(path).tenants``) or
    a mapping shaped like it (capacity_rows_per_s, classes with share, ceiling, beyond,
    slo_ms, members): the worker's tenant gate in front of the queue, and each class's
    SLA as its events' deadline budget (docs/BATCHING.md, "Tenants"). ``tenant`` reads
    an event's tenant id (default: the prepared object's ``.tenant``, or a dict value's
    "tenant"). Events shed over a ceiling come back in ``batch.routed_late``; with
    ``metrics`` the worker's per-class series (pipeline/observe/tenant_metrics.py) too.

    ``clock`` (monotonic seconds) and ``wall_clock_ms`` (epoch ms, deadlines) are the
    driver's time; tests pass fakes.
    """
    clock = clock or MonotonicClock()  # one clock for the driver and the tenant gate's gauges
    core = make_core(
        policy,
        slo_ms=slo_ms,
        max_batch_rows=max_batch_rows,
        max_queue_delay_ms=max_queue_delay_ms,
        policy_params=policy_params,
        cost_model=cost_model,
        expiry_action=expiry_action,
        late_share=late_share,
        allowed_batch_sizes=allowed_batch_sizes,
        tenants=tenants,
    )
    tenant_outcomes = None
    if metrics is not None and core.batcher.tenants is not None:
        tenant_outcomes = watch_tenants(
            metrics.registry, metrics.pipeline, core.batcher.tenants, clock.now,
            LATENCY_BUCKETS, core.class_slo_s,
        )
    if rows is None and prepare is None:
        rows = _one_row
    return AdaptiveBatches(
        stream,
        core,
        rows=rows,
        prepare=prepare,
        priority=priority,
        bucket=bucket,
        deadline_ms=deadline_ms,
        tenant=tenant,
        max_queued_rows=max_queued_rows,
        max_pending_acks=max_pending_acks,
        metrics=metrics,
        tenant_outcomes=tenant_outcomes,
        clock=clock,
        wall_clock_ms=wall_clock_ms,
    )


def _one_row(_value: Any) -> int:
    return 1


__all__ = [
    "REASON_REJECTED",
    "REASON_ROUTED_LATE",
    "AckGate",
    "AdaptiveBatches",
    "BatchMetrics",
    "BatchingCore",
    "FaustBatch",
    "PartitionKey",
    "Pending",
    "PrepareFn",
    "Rejected",
    "ack_gate_for",
    "adaptive_batches",
    "make_core",
]
