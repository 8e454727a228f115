"""The tenant gate as admission sees it from the source thread: which tenants' classes
are over their share (the gate lives in the batcher, behind BatchQueue's lock), and the
per-class count of the records admission routes late before decoding, so every request
of a class has its one outcome in tidebatch_tenant_requests_total
(pipeline/observe/tenant_metrics.py), as late_routing.py does for what the batcher routes."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.batching.concurrent import BatchQueue
from pipeline.observe.tenant_metrics import TenantOutcomes


class GateStanding:
    """admission.TenantStanding over the worker's queue and its tenant metrics."""

    def __init__(self, queue: BatchQueue, outcomes: TenantOutcomes | None) -> None:
        if queue.batcher.tenants is None:
            raise ValueError("a tenant standing needs a batcher with a tenant gate")
        self.queue = queue
        self.outcomes = outcomes

    def over_share(self, tenants: Sequence[str | None], now: float) -> list[bool]:
        return self.queue.over_share(tenants, now)

    def routed(self, tenants: Sequence[str | None]) -> None:
        gate = self.queue.batcher.tenants
        if self.outcomes is not None and gate is not None:
            self.outcomes.routed([gate.class_of(t) for t in tenants])


def gate_standing(queue: BatchQueue, outcomes: TenantOutcomes | None) -> GateStanding | None:
    """The worker's standing, or None without tenant classes."""
    return None if queue.batcher.tenants is None else GateStanding(queue, outcomes)
