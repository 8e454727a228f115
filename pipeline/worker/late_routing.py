"""Requests the batcher routed unscored (expired, or shed over a tenant class's
ceiling: pipeline/batching/batcher.py `_to_late`) to the late topic, counted per tenant
class where there is a `tenants:` section, so every request of a class has one outcome
in tidebatch_tenant_requests_total (pipeline/tenant_metrics.py): ok, late or
routed_late."""

from __future__ import annotations

from pipeline.batching.concurrent import BatchQueue
from pipeline.clock import wall_ms
from pipeline.outcomes import Outcomes
from pipeline.tenant_metrics import TenantOutcomes


def route_late(queue: BatchQueue, outcomes: Outcomes, tenants: TenantOutcomes | None) -> None:
    """Send what the batcher routed since the last call; the source thread calls it."""
    routed = queue.pop_routed_late()
    if not routed:
        return
    outcomes.late([(req.item.rec, req.item.deadline_wall_ms) for req in routed], wall_ms())
    if tenants is not None:
        tenants.routed([req.tenant_class for req in routed if req.tenant_class is not None])
