"""The batching core: queue + policy + cost model + late lane, driven by the caller's
clock. No threads, no I/O: the worker wraps it in a lock and a condition variable, the
simulator calls it from a discrete-event loop, tests call it with a FakeClock."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Literal

from pipeline.batching.cost import CostModel
from pipeline.batching.policy_base import Dispatch, Policy, PolicyContext, Wait
from pipeline.batching.queue import RequestQueue
from pipeline.batching.rate import RateEstimator
from pipeline.batching.request import (
    REASON_DRAIN,
    REASON_LATE,
    RULE_HOPELESS,
    RULE_OVER_CEILING,
    RULE_OVERDUE,
    Batch,
    Request,
)
from pipeline.batching.tenants import RED, TenantGate

ExpiryAction = Literal["score_late", "route_late"]
EXPIRY_ACTIONS = ("score_late", "route_late")


def _rule(req: Request, now: float) -> str:
    """Why the policy gave up on `req`: past its deadline, or predicted to miss it."""
    return RULE_OVERDUE if now >= req.deadline else RULE_HOPELESS


class Batcher:
    def __init__(
        self,
        policy: Policy,
        cost_model: CostModel | None = None,
        *,
        expiry_action: ExpiryAction = "score_late",
        late_share: float = 0.05,
        max_late_rows: int = 100_000,
        allowed_batch_sizes: Sequence[int] | None = None,
        rate_half_life: float = 0.25,
        tenants: TenantGate | None = None,
    ) -> None:
        if expiry_action not in EXPIRY_ACTIONS:
            raise ValueError(f"expiry_action must be one of {EXPIRY_ACTIONS}, not {expiry_action!r}")
        if not 0.0 <= late_share <= 1.0:
            raise ValueError("late_share must be within [0, 1]")
        if max_late_rows < 0:
            raise ValueError("max_late_rows must be >= 0")
        if allowed_batch_sizes is not None and any(int(n) < 1 for n in allowed_batch_sizes):
            raise ValueError("allowed_batch_sizes must all be >= 1")
        self.policy = policy
        self.cost = cost_model or CostModel()
        self.expiry_action = expiry_action
        self.late_share = late_share
        self.max_late_rows = max_late_rows
        self.allowed = sorted(set(allowed_batch_sizes)) if allowed_batch_sizes else None
        self.max_batch_rows = policy.max_batch_rows
        if self.allowed:
            self.max_batch_rows = min(self.max_batch_rows, self.allowed[-1])
        self._queue = RequestQueue(policy.ordering)
        self._late = RequestQueue("fifo")
        self._routed: list[Request] = []
        self._rate_half_life = rate_half_life
        self._rate = RateEstimator(rate_half_life)
        self._prio_rates: dict[int, RateEstimator] = {}
        self._wake: float | None = None
        # Rows the late lane is owed: grows by late_share of the in-time rows served
        # while late work waits, shrinks by the late rows served. Only accrues while the
        # late lane is non-empty, so a long calm spell does not bank a debt that would
        # later starve in-time work.
        self._late_credit = 0.0
        # Per-tenant shares and ceilings (batching/tenants.py); None: one shared queue.
        self.tenants = tenants

    # -- state ----------------------------------------------------------------
    @property
    def rows(self) -> int:
        """Rows held in memory (in-time queue + late lane)."""
        return self._queue.rows + self._late.rows

    @property
    def late_rows(self) -> int:
        return self._late.rows

    @property
    def backpressure_rows(self) -> int:
        """Rows that count against the queue's watermarks: the in-time queue while it
        holds anything, else the late lane.

        While in-time work waits, late work must not stall consumption: a held consumer
        under overload would leave the Kafka backlog to age until everything in it is
        late, so the late lane keeps its own bound then (max_late_rows, overflow routed).
        With no in-time work queued, everything arriving is already late (a backlog
        drain, a catch-up): holding intake then costs no request its deadline, and not
        holding it would let a decoder faster than the model overflow the late lane and
        route unscored what score_late promised to score (docs/BATCHING.md,
        "Backpressure")."""
        return self._queue.rows or self._late.rows

    def __len__(self) -> int:
        return len(self._queue) + len(self._late)

    def arrival_rate(self, now: float) -> float:
        return self._rate.rate(now)

    # -- input ----------------------------------------------------------------
    def add(self, req: Request, now: float) -> None:
        if self.tenants is not None and self.tenants.mark(req, now) == RED and self._beyond_ceiling(req):
            return
        self._rate.observe(now, req.rows)
        prio_rate = self._prio_rates.get(req.priority)
        if prio_rate is None:
            prio_rate = self._prio_rates[req.priority] = RateEstimator(self._rate_half_life)
        prio_rate.observe(now, req.rows)
        if self.policy.separates_late:
            queued = self._queue.bucket_rows(req.bucket) + req.rows
            if self.policy.hopeless(req, self._context(now), now, queued):
                self._to_late(req, _rule(req, now))
                self._wake = None
                return
        self._queue.push(req)
        self._wake = None

    def _beyond_ceiling(self, req: Request) -> bool:
        """Act on a request over its class's ceiling; False: queue it (two tiers down)."""
        assert self.tenants is not None
        action = self.tenants.beyond(req)
        if action == "queue":
            return False
        if action == "shed":
            self.tenants.shed(req)
        self._to_late(req, RULE_OVER_CEILING, route=action == "shed")
        self._wake = None
        return True

    def _context(self, now: float) -> PolicyContext:
        return PolicyContext(
            self.cost,
            max_rows=self.max_batch_rows,
            pad=self._padded,
            rate_fn=lambda: self._rate.rate(now),
            priority_rates_fn=lambda: {p: r.rate(now) for p, r in self._prio_rates.items()},
        )

    def _padded(self, rows: int) -> int:
        return self._pad_to(rows) or rows

    def _to_late(self, req: Request, rule: str, route: bool | None = None) -> None:
        """Off the model's path: routed (route, default per expiry_action) or the late lane."""
        req.late = True
        req.late_rule = rule
        if route is None:
            route = self.expiry_action == "route_late"
        if route or self._late.rows + req.rows > self.max_late_rows:
            # Beyond the late lane's bound, keeping it would grow memory without limit
            # under sustained overload: route it instead (still exactly one outcome).
            self._routed.append(req)
        else:
            self._late.push(req)

    @property
    def routed_pending(self) -> int:
        """Requests waiting in pop_routed_late()."""
        return len(self._routed)

    def pop_routed_late(self) -> list[Request]:
        """Requests to publish unscored to the late topic (taken once)."""
        out, self._routed = self._routed, []
        return out

    # -- dispatch ---------------------------------------------------------------
    def next_batch(self, now: float) -> Batch | None:
        """Called when an executor is free. A batch to run now, or None (then
        next_wakeup() says when to ask again, None meaning at the next arrival)."""
        self._wake = None
        if not len(self._queue) and not len(self._late):
            return None
        ctx = self._context(now)
        if self.policy.separates_late:
            self._sweep(ctx, now)
        if len(self._late) and (not len(self._queue) or self._late_owed()):
            return self._late_batch(now)
        if not len(self._queue):
            return None
        decision = self.policy.decide(self._queue, ctx, now)
        if isinstance(decision, Wait):
            self._wake = decision.until
            return None
        return self._form(decision, now)

    def next_wakeup(self) -> float | None:
        return self._wake

    def _sweep(self, ctx: PolicyContext, now: float) -> None:
        """Move requests the policy calls hopeless from the top of each priority heap to
        the late lane (EDF: the top is the tightest deadline)."""
        for bucket in self._queue.buckets():
            queued = self._queue.bucket_rows(bucket)

            def hopeless(r: Request, queued: int = queued) -> bool:
                return self.policy.hopeless(r, ctx, now, queued)

            for req in self._queue.pop_while(bucket, hopeless):
                self._to_late(req, _rule(req, now))

    def _late_owed(self) -> bool:
        return self._late_credit > 0.0

    def _late_batch(self, now: float) -> Batch:
        bucket = min(self._late.heads(), key=lambda r: r.seq).bucket
        reqs = self._late.take(bucket, self.max_batch_rows)
        return self._finish(reqs, bucket, REASON_LATE, now, late=True)

    def _form(self, d: Dispatch, now: float) -> Batch:
        max_rows = min(d.max_rows, self.max_batch_rows) if d.max_rows else 0
        reqs = self._queue.take(d.bucket, max_rows, d.fits)
        if self.tenants is not None:
            self.tenants.served(reqs, now)
        return self._finish(reqs, d.bucket, d.reason, now)

    def _finish(self, reqs: list[Request], bucket, reason: str, now: float, late: bool = False) -> Batch:
        rows = sum(r.rows for r in reqs)
        if late:
            self._late_credit = max(self._late_credit - rows, -float(self.max_batch_rows))
        elif len(self._late):
            if self.late_share >= 1.0:
                self._late_credit = float("inf")
            else:
                # share/(1-share): late rows end up late_share of all rows served.
                self._late_credit += rows * self.late_share / (1.0 - self.late_share)
        if not len(self._late) and self._late_credit > 0:
            self._late_credit = 0.0
        return Batch(reqs, rows, bucket, reason, now, late=late, pad_to_rows=self._pad_to(rows))

    def _pad_to(self, rows: int) -> int | None:
        if not self.allowed:
            return None
        i = bisect.bisect_left(self.allowed, rows)
        if i == len(self.allowed):
            return None  # larger than any allowed size: run as is (config forbids it upstream)
        size = self.allowed[i]
        return size if size != rows else None

    # -- feedback and shutdown ----------------------------------------------------
    def observe(self, batch: Batch, seconds: float) -> None:
        """Feed a finished batch's measured service time back into the cost model."""
        self.cost.observe(batch.bucket, batch.pad_to_rows or batch.rows, seconds)

    def drain(self, now: float) -> list[Batch]:
        """Everything still queued, as batches, for a graceful shutdown."""
        out: list[Batch] = []
        for queue, late in ((self._queue, False), (self._late, True)):
            while len(queue):
                bucket = next(iter(queue.heads())).bucket
                reqs = queue.take(bucket, self.max_batch_rows)
                out.append(self._finish(reqs, bucket, REASON_DRAIN, now, late=late))
        return out
