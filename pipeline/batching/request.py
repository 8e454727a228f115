"""What the batching core queues and what it hands to an executor."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True, eq=False)
class Request:
    """One queued request. Times are on the batcher's clock (seconds)."""

    rows: int
    arrival: float
    deadline: float
    priority: int = 0  # lower number = served first
    bucket: Hashable = 0
    item: Any = None  # opaque to the core: what the batch runner needs
    seq: int = field(default=0)  # arrival order, set by the queue (FIFO tie-break)
    late: bool = False  # set when the request is moved to the late lane
    tenant: str | None = None  # the tenant id the request carries (codecs/base.py Decoded)
    tenant_class: str | None = None  # its class, set by the tenant gate (batching/tenants.py)
    late_rule: str | None = None  # which rule took it off the model's path (RULE_* below)
    # The deadline EDF orders by, where `deadline` is tightened by an amount that changes
    # over time (the worker's answer tail, pipeline/worker/admission.py): requests with
    # equal own deadlines must keep their arrival order, or one key's results come out
    # of order (a camera's frames, all stamped alike, were published 0,1,4,5,2,3 after
    # the tail grew between two polls). None: `deadline`.
    due: float | None = None


def edf_deadline(req: Request) -> float:
    """What earliest-deadline-first orders `req` by (Request.due)."""
    return req.deadline if req.due is None else req.due


# Which rule routed a request late, unscored: the tidebatch.late_rule header of its late
# record and the `rule` label of tidebatch_routed_late_total, so a user can tell a
# request that was already too old from one a policy gave up on (issue 26).
RULE_EXPIRED = "expired"  # before decoding: already past its deadline
RULE_SHED = "shed"  # before decoding: too old to keep the reserve (batching/shed.py)
# In the queue, past the deadline the batcher holds: the worker's is the request's less
# the answer tail (batching/tail.py), so the request itself may still have had time.
RULE_OVERDUE = "overdue"
RULE_HOPELESS = "hopeless"  # in the queue: the policy predicts it cannot make its deadline
RULE_OVER_CEILING = "over_ceiling"  # its tenant class is over its ceiling (batching/tenants.py)


# Why a batch closed; also the label of the batch-close metric.
REASON_FULL = "full"  # reached max rows
REASON_LINGER = "linger"  # static: oldest waited max_queue_delay
REASON_IDLE = "idle"  # work-conserving: an executor was free and waiting could not help
REASON_DEADLINE = "deadline"  # waiting longer would miss a deadline
REASON_SINGLE = "single"  # policy none
REASON_LATE = "late"  # expired requests, scored after in-time work
REASON_DRAIN = "drain"  # shutdown: flush what is queued


@dataclass(slots=True)
class Batch:
    requests: list[Request]
    rows: int
    bucket: Hashable
    reason: str
    formed_at: float
    late: bool = False  # every request in it already missed its deadline
    pad_to_rows: int | None = None  # allowed_batch_sizes: pad the batch axis up to this
    # Dispatch order, numbered by BatchQueue from 0: with several batches in flight
    # the worker publishes results in this order, so one key's results keep its order.
    seq: int = -1

    @property
    def oldest_arrival(self) -> float:
        return min(r.arrival for r in self.requests)
