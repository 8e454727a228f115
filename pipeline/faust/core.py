"""The pure core of the Faust batching helper (pipeline/faust/batching.py): events
in, batches out, acks only for batches that succeeded.

No Faust, no asyncio, no clock of its own: ``now`` is passed in, so the unit tests
drive it with a fake clock. It wraps the worker's ``Batcher`` (pipeline/batching:
policy + cost model + late lane); each event's deadline is its Kafka timestamp plus the
SLO (tightened by a codec's own ``deadline_ms``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import CostModel
from pipeline.batching.policies import make_policy
from pipeline.batching.policies import policy_params as make_policy_params
from pipeline.batching.request import Batch, Request
from pipeline.clock import ClockAnchor


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


class BatchingCore:
    """The pure part: events in, batches out, acks only for batches that succeeded.

    ``now`` is always passed in (seconds on a monotonic clock) together with the wall
    clock in ms where a Kafka timestamp has to be mapped; nothing here reads time.
    """

    def __init__(self, batcher: Batcher, slo_ms: float = 100.0) -> None:
        if slo_ms <= 0:
            raise ValueError("slo_ms must be > 0")
        self.batcher = batcher
        self.slo_ms = float(slo_ms)
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
    ) -> Pending:
        """Queue one event. Its deadline is its Kafka timestamp (now when it has none)
        plus the SLO, tightened by its own ``deadline_ms``; its linger counts from
        ``now``, the moment it was taken from the stream."""
        if rows < 1:
            raise ValueError(f"an event must have at least 1 row, got {rows}")
        budget_ms = self.slo_ms if deadline_ms is None else min(self.slo_ms, float(deadline_ms))
        ts = float(timestamp_ms) if timestamp_ms is not None else float(now_wall_ms)
        deadline_wall = ts + budget_ms
        anchor = self._anchor.pair(now, now_wall_ms)
        pending = Pending(
            event, prepared, rows, priority, now, now_wall_ms, timestamp_ms, deadline_wall
        )
        self.batcher.add(
            Request(
                rows=rows,
                arrival=now,
                deadline=ClockAnchor.to_clock(anchor, deadline_wall),
                priority=priority,
                bucket=bucket,
                item=pending,
            ),
            now,
        )
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
) -> BatchingCore:
    """A BatchingCore with a policy built by name, as the worker builds its own
    (``max_queue_delay_ms`` is the static policy's linger, ignored by the others)."""
    params = make_policy_params(policy, max_batch_rows=max_batch_rows, max_queue_delay_ms=max_queue_delay_ms)
    params.update(policy_params or {})
    batcher = Batcher(
        make_policy(policy, **params),
        cost_model or CostModel(),
        expiry_action=expiry_action,  # type: ignore[arg-type]
        late_share=late_share,
        allowed_batch_sizes=allowed_batch_sizes,
    )
    return BatchingCore(batcher, slo_ms)
