"""Requests the batcher routed unscored (overdue, hopeless, or shed over a tenant
class's ceiling: pipeline/batching/batcher.py `_to_late`) to the late topic, each late
record naming its rule (pipeline/batching/request.py RULE_*), counted per tenant
class where there is a `tenants:` section, so every request of a class has one outcome
in tidebatch_tenant_requests_total (pipeline/observe/tenant_metrics.py): ok, late or
routed_late."""

from __future__ import annotations

from collections.abc import Callable

from consumers.records import SourceRecord
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.request import RULE_OVERDUE
from pipeline.clock import wall_ms
from pipeline.delivery.outcomes import Outcomes
from pipeline.delivery.transactions import Transactions
from pipeline.observe.tenant_metrics import TenantOutcomes


def route_late(queue: BatchQueue, outcomes: Outcomes, tenants: TenantOutcomes | None) -> None:
    """Send what the batcher routed since the last call; the source thread calls it."""
    routed = queue.pop_routed_late()
    if not routed:
        return
    now = wall_ms()
    by_rule: dict[str, list[tuple[SourceRecord, float]]] = {}
    for req in routed:
        by_rule.setdefault(req.late_rule or RULE_OVERDUE, []).append((req.item.rec, req.item.deadline_wall_ms))
    for rule, late in by_rule.items():
        outcomes.late(late, now, rule)
    if tenants is not None:
        tenants.routed([req.tenant_class for req in routed if req.tenant_class is not None])


def outcome_server(
    queue: BatchQueue, outcomes: Outcomes, tenants: TenantOutcomes | None, transactions: Transactions | None
) -> Callable[[], None]:
    """The source thread's outcome duty, every loop turn and while a revoke waits for its
    partitions' work (pipeline/delivery/partitions.py): send what the batcher routed
    late, and with delivery exactly_once produce the outcomes now next in line."""

    def serve() -> None:
        route_late(queue, outcomes, tenants)
        if transactions is not None:
            transactions.release()

    return serve
