"""What the Faust batching driver yields (``FaustBatch``) and the events riding along
with it (``Rejected``); the reasons of batches that carry no model work."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from pipeline.batching.request import Batch
from pipeline.faust.core import Pending

# Reasons of batches that carry no model work (their events still need acks).
REASON_REJECTED = "rejected"
REASON_ROUTED_LATE = "routed_late"


@dataclass(slots=True)
class Rejected:
    """An event whose prepare() raised (invalid input): the body should dead-letter it;
    it is acked with the batch that carries it."""

    event: Any
    error: Exception


@dataclass(eq=False)
class FaustBatch:
    """What ``adaptive_batches`` yields.

    ``events``/``values``/``prepared`` are the events to process, in batch order.
    ``rejected`` (prepare() raised) and ``routed_late`` (the policy gave up on them,
    expiry_action="route_late") ride along with the next batch -- possibly one with no
    events -- so the body can publish them; they are acked with it.
    """

    items: list[Pending]
    reason: str
    rows: int
    pad_to_rows: int | None
    formed_at: float  # core clock
    formed_wall_ms: int
    late: bool  # every event of it already missed its deadline (the late lane)
    rejected: list[Rejected] = field(default_factory=list)
    routed_late: list[Pending] = field(default_factory=list)
    # The body may set this (seconds of model work) instead of the measured body time.
    service_seconds: float | None = None
    # Final outcome per item index where it is not ok/late (e.g. "dlq": the model
    # refused that request and the body dead-lettered it); used by the metrics.
    outcomes: dict[int, str] = field(default_factory=dict)
    _core_batch: Batch | None = field(default=None, repr=False)
    _deferred: list[Awaitable[Any]] = field(default_factory=list, repr=False)
    _yielded_at: float = 0.0

    @property
    def events(self) -> list[Any]:
        return [p.event for p in self.items]

    @property
    def values(self) -> list[Any]:
        return [p.event.value for p in self.items]

    @property
    def prepared(self) -> list[Any]:
        return [p.prepared for p in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def defer_ack(self, *awaitables: Awaitable[Any]) -> None:
        """Acknowledge this batch's events only once these complete (e.g. the result
        sends' delivery futures), instead of as soon as the body returns. The body
        can then return while Kafka delivers, and the next batch starts at once. If
        one of them fails, the events stay unacked and the iterator raises."""
        self._deferred.extend(awaitables)
