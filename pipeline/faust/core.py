"""The pure core of the Faust batching helper (pipeline/faust/batching.py): events
in, batches out, acks only for batches that succeeded.

No Faust, no asyncio, no clock of its own: ``now`` is passed in, so the unit tests
drive it with a fake clock. It wraps the worker's ``Batcher`` (pipeline/batching:
policy + cost model + late lane); each event's deadline is its Kafka timestamp plus the
SLO (tightened by a codec's own ``deadline_ms``). With tenant classes (the worker
config's `tenants:` section, pipeline/config/tenants.py) the batcher has the worker's
tenant gate, and an event's SLO is its class's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import CostModel
from pipeline.batching.registry import make_policy
from pipeline.batching.registry import policy_params as make_policy_params
from pipeline.batching.request import Batch, Request
from pipeline.clock import ClockAnchor
from pipeline.config import BatchingConfig
from pipeline.config.tenants import TenantsConfig, class_slo_seconds, tenant_budget_ms, tenant_gate
from pipeline.faust.tenants import tenants_section

BudgetFn = Callable[[str | None, int], float]  # (tenant id, priority) -> deadline budget, ms


@dataclass(slots=True, eq=False)
class Pending:
    """One event held by the core (the Request's item)."""

    event: Any  # opaque to the core: a Faust Event in the driver
    prepared: Any  # what prepare() made of it (e.g. a codec's Decoded), else the value
    rows: int
    priority: int
    arrival: float  # core clock (seconds)
    arrival_wall_ms: int
    timestamp_ms: float | None  # the event's Kafka timestamp
    deadline_wall_ms: float
    late_rule: str | None = None  # set when routed late (pipeline/batching/request.py RULE_*)
    tenant_class: str | None = None  # the gate's class of its tenant; None without classes



class BatchingCore:
    """The pure part: events in, batches out, acks only for batches that succeeded.

    ``now`` is always passed in (seconds on a monotonic clock) together with the wall
    clock in ms where a Kafka timestamp has to be mapped; nothing here reads time.
    """

    def __init__(self, batcher: Batcher, slo_ms: float = 100.0, budget_ms: BudgetFn | None = None) -> None:
        if slo_ms <= 0:
            raise ValueError("slo_ms must be > 0")
        self.batcher = batcher
        self.slo_ms = float(slo_ms)
        self._budget_ms = budget_ms  # per tenant class (tenant_budget_ms); None: slo_ms
        self.class_slo_s: dict[str, float] = {}  # each tenant class's SLA, for its metrics
        self._anchor = ClockAnchor()  # Kafka timestamps -> batcher clock, as the worker
        self._in_flight: dict[int, Batch] = {}  # id(batch) -> batch, until complete/fail

    # -- input ------------------------------------------------------------------
    def offer(
        self,
        event: Any,
        *,
        now: float,
        now_wall_ms: int,
        rows: int = 1,
        timestamp_ms: float | None = None,
        prepared: Any = None,
        priority: int = 0,
        bucket: Hashable = 0,
        deadline_ms: float | None = None,
        tenant: str | None = None,
    ) -> Pending:
        """Queue one event. Its deadline is its Kafka timestamp (now when it has none)
        plus the SLO (its tenant class's, with classes), tightened by its own
        ``deadline_ms``; its linger counts from ``now``, the moment it was taken from
        the stream."""
        if rows < 1:
            raise ValueError(f"an event must have at least 1 row, got {rows}")
        slo_ms = self._budget_ms(tenant, priority) if self._budget_ms is not None else self.slo_ms
        budget_ms = slo_ms if deadline_ms is None else min(slo_ms, float(deadline_ms))
        ts = float(timestamp_ms) if timestamp_ms is not None else float(now_wall_ms)
        deadline_wall = ts + budget_ms
        anchor = self._anchor.pair(now, now_wall_ms)
        pending = Pending(
            event, prepared, rows, priority, now, now_wall_ms, timestamp_ms, deadline_wall
        )
        req = Request(
            rows=rows,
            arrival=now,
            deadline=ClockAnchor.to_clock(anchor, deadline_wall),
            priority=priority,
            bucket=bucket,
            item=pending,
            tenant=tenant,
        )
        self.batcher.add(req, now)
        pending.tenant_class = req.tenant_class
        return pending

    # -- dispatch ---------------------------------------------------------------
    def next_batch(self, now: float) -> Batch | None:
        """A batch to run now (it is in flight until complete() or fail()), or None:
        then next_wakeup() says when to ask again (None: at the next event)."""
        batch = self.batcher.next_batch(now)
        if batch is not None:
            self._in_flight[id(batch)] = batch
        return batch

    def next_wakeup(self) -> float | None:
        return self.batcher.next_wakeup()

    def pop_routed_late(self) -> list[Pending]:
        """Events the policy gave up on (expiry_action="route_late"): publish them to a
        late topic, then ack them like a batch (complete_routed)."""
        routed = self.batcher.pop_routed_late()
        for r in routed:
            r.item.late_rule = r.late_rule
        return [r.item for r in routed]

    def drain(self, now: float) -> list[Batch]:
        """Everything still queued, as batches (the stream ended)."""
        batches = self.batcher.drain(now)
        for b in batches:
            self._in_flight[id(b)] = b
        return batches

    # -- outcome ------------------------------------------------------------------
    def complete(self, batch: Batch, seconds: float) -> list[Pending]:
        """The body succeeded: feed its service time to the cost model and return the
        events to acknowledge."""
        if self._in_flight.pop(id(batch), None) is None:
            raise ValueError("complete() of a batch that is not in flight")
        if batch.requests:
            self.batcher.observe(batch, seconds)
        return [r.item for r in batch.requests]

    def fail(self, batch: Batch) -> list[Pending]:
        """The body raised: nothing is acknowledged and nothing is learned (a crash
        says nothing about the model's cost). Returns the events left unacked; their
        offsets stay uncommitted, so Kafka delivers them again after a restart."""
        if self._in_flight.pop(id(batch), None) is None:
            raise ValueError("fail() of a batch that is not in flight")
        return [r.item for r in batch.requests]

    # -- state --------------------------------------------------------------------
    @property
    def queued_rows(self) -> int:
        return self.batcher.rows

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def __len__(self) -> int:
        return len(self.batcher)


def make_core(
    policy: str = "adaptive",
    *,
    slo_ms: float = 100.0,
    max_batch_rows: int = 512,
    max_queue_delay_ms: float = 10.0,
    policy_params: dict[str, Any] | None = None,
    cost_model: CostModel | None = None,
    expiry_action: str = "score_late",
    late_share: float = 0.05,
    allowed_batch_sizes: Sequence[int] | None = None,
    tenants: TenantsConfig | Mapping[str, Any] | None = None,
) -> BatchingCore:
    """A BatchingCore with a policy built by name, as the worker builds its own
    (``max_queue_delay_ms`` is the static policy's linger, ignored by the others).
    ``tenants``: a worker config's `tenants` section, or a mapping shaped like it, for
    the worker's tenant gate and per-class SLAs (docs/BATCHING.md, "Tenants")."""
    t = tenants_section(tenants) if tenants is not None else None
    # The worker's `batching:` section as the tenants section reads it (class_budget_ms):
    # the helper has one SLO and no per-priority ones.
    budgets = BatchingConfig(slo_ms=float(slo_ms))
    gate = tenant_gate(t, budgets) if t is not None else None
    params = make_policy_params(policy, max_batch_rows=max_batch_rows, max_queue_delay_ms=max_queue_delay_ms)
    params.update(policy_params or {})
    batcher = Batcher(
        make_policy(policy, **params),
        cost_model or CostModel(),
        expiry_action=expiry_action,  # type: ignore[arg-type]
        late_share=late_share,
        allowed_batch_sizes=allowed_batch_sizes,
        tenants=gate,
    )
    core = BatchingCore(batcher, slo_ms, tenant_budget_ms(t, budgets, gate) if t is not None else None)
    if t is not None and gate is not None:
        core.class_slo_s = class_slo_seconds(t, budgets)
    return core
