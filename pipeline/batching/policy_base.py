"""What every batching policy shares (pipeline/batching/policies.py holds the
policies): the decision a policy returns (Dispatch a batch now, or Wait), the
PolicyContext it decides with (cost model, arrival rates, limits), and the Policy base
class. Pure: no clock of their own, no I/O."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from pipeline.batching.cost import CostModel
from pipeline.batching.queue import Ordering, RequestQueue
from pipeline.batching.request import Request


@dataclass(slots=True)
class Dispatch:
    bucket: Hashable
    max_rows: int
    reason: str
    fits: Callable[[int, Request], bool] | None = None


@dataclass(slots=True)
class Wait:
    until: float | None  # None: nothing to do until the next arrival


Decision = Dispatch | Wait


def _no_pad(rows: int) -> int:
    return rows


class PolicyContext:
    """What a policy may look at besides the queue. Rates are computed on first use:
    the batcher builds a context per arrival and most decisions never need them."""

    __slots__ = ("cost", "max_rows", "pad", "_rate", "_rate_fn", "_prio", "_prio_fn")

    def __init__(
        self,
        cost: CostModel,
        arrival_rate: float | None = None,
        max_rows: int = 0,
        priority_rates: dict[int, float] | None = None,
        pad: Callable[[int], int] = _no_pad,
        *,
        rate_fn: Callable[[], float] | None = None,
        priority_rates_fn: Callable[[], dict[int, float]] | None = None,
    ) -> None:
        self.cost = cost
        # The batcher's effective max rows (allowed_batch_sizes may lower the policy's
        # own); 0: the policy's own max_batch_rows.
        self.max_rows = max_rows
        # Rows a batch of n rows actually runs as (allowed_batch_sizes padding).
        self.pad = pad
        self._rate = arrival_rate
        self._rate_fn = rate_fn
        self._prio = priority_rates
        self._prio_fn = priority_rates_fn

    @property
    def arrival_rate(self) -> float:
        """Recent arrival rate, rows/s, all priorities."""
        if self._rate is None:
            self._rate = self._rate_fn() if self._rate_fn else 0.0
        return self._rate

    @property
    def priority_rates(self) -> dict[int, float]:
        """Recent arrival rate (rows/s) of each priority level."""
        if self._prio is None:
            self._prio = self._prio_fn() if self._prio_fn else {}
        return self._prio

    def rate_upto(self, priority: int) -> float:
        """Arrival rate of this priority level and every level served before it: the
        load a request of this level competes with under strict priority."""
        rates = self.priority_rates
        if not rates:
            return self.arrival_rate
        return sum(r for p, r in rates.items() if p <= priority)


class Policy:
    name = "base"
    ordering: Ordering = "fifo"
    separates_late = False  # moves requests that cannot make their deadline off the model's path

    def __init__(self, max_batch_rows: int) -> None:
        if max_batch_rows < 1:
            raise ValueError("max_batch_rows must be >= 1")
        self.max_batch_rows = max_batch_rows

    def max_rows(self, ctx: PolicyContext) -> int:
        return min(ctx.max_rows, self.max_batch_rows) if ctx.max_rows else self.max_batch_rows

    def decide(self, queue: RequestQueue, ctx: PolicyContext, now: float) -> Decision:
        raise NotImplementedError

    def hopeless(self, req: Request, ctx: PolicyContext, now: float, queued_rows: int) -> bool:
        """Whether req should leave the model's path (only asked when separates_late).
        Base rule: it could not finish in time even if served alone right now."""
        return now + ctx.cost.predict(req.bucket, ctx.pad(req.rows)) > req.deadline

    def describe(self) -> dict:
        return {"policy": self.name, "max_batch_rows": self.max_batch_rows}
