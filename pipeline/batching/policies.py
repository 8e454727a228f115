"""Batching policies: given the queue and the time, dispatch a batch now or say when
to look again. Policies are consulted only when an executor is free, so "dispatch"
always means "run it now". Pure: no clock of their own, no I/O.

- none      every request alone.
- static    Triton-like: dispatch at max_batch_rows, or when the OLDEST queued request
            has waited max_queue_delay (the timer counts from its arrival, not from the
            start of a wait — the trap Faust, TorchServe and Bytewax fall into).
- greedy    work-conserving: whatever is queued, up to the max, the moment an executor
            frees.
- adaptive  greedy's work-conservation plus what greedy lacks: EDF within a priority
            level, a batch-size cap so the batch's predicted service time does not blow
            the tightest deadline in it, requests that cannot make their deadline in a
            batch big enough to keep up with the load moved off the model's path (the
            batcher's late lane), strict priority between levels, one request per batch
            where batching does not pay, and, only when executor time has a price
            (hold_for_efficiency), spending SLO slack to grow batches.
            docs/BATCHING.md explains the choice.

Built by name through pipeline/batching/registry.py, where each is registered once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable

from pipeline.batching.cost import AffineCost
from pipeline.batching.policy_base import Decision, Dispatch, Policy, PolicyContext, Wait
from pipeline.batching.queue import Ordering, RequestQueue
from pipeline.batching.request import (
    REASON_DEADLINE,
    REASON_FULL,
    REASON_IDLE,
    REASON_LINGER,
    REASON_SINGLE,
    Request,
    edf_deadline,
)

# Where batching does not pay, a congested executor still gains from a few rows per
# call, but a share of the affine capacity close to 1 asks for batches far outside the
# sizes the warm-up measured, where a model like CenterFace on CPU is slower per frame:
# 98 % needs 49·a/b rows and gives up at most 2 % (measured: docs/BATCHING.md, "adaptive,
# rule by rule", rule 4).
_CONGESTED_SHARE = 0.98


def _rows_for_rate(cost: AffineCost, rate: float, max_rows: int) -> int:
    """Smallest n whose throughput n / t(n) reaches `rate` rows/s; max_rows when no
    batch size does."""
    if rate <= 0:
        return 1
    denom = 1.0 - rate * cost.b
    if denom <= 0:
        return max_rows
    return int(min(max(math.ceil(rate * cost.a / denom), 1), max_rows))


def _first_bucket(queue: RequestQueue, key: Callable[[Request], tuple]) -> Hashable | None:
    heads = list(queue.heads())
    if not heads:
        return None
    return min(heads, key=key).bucket


def _fifo_key(req: Request) -> tuple:
    return (req.priority, req.seq)


def _edf_key(req: Request) -> tuple:
    return (req.priority, edf_deadline(req), req.seq)


class NonePolicy(Policy):
    name = "none"

    def __init__(self, max_batch_rows: int = 1) -> None:
        super().__init__(max_batch_rows)

    def decide(self, queue: RequestQueue, ctx: PolicyContext, now: float) -> Decision:
        bucket = _first_bucket(queue, _fifo_key)
        if bucket is None:
            return Wait(None)
        # max_rows 0: take() still takes the first request, and never a second.
        return Dispatch(bucket, 0, REASON_SINGLE)


class GreedyPolicy(Policy):
    name = "greedy"

    def decide(self, queue: RequestQueue, ctx: PolicyContext, now: float) -> Decision:
        bucket = _first_bucket(queue, _fifo_key)
        if bucket is None:
            return Wait(None)
        max_rows = self.max_rows(ctx)
        full = queue.bucket_rows(bucket) >= max_rows
        return Dispatch(bucket, max_rows, REASON_FULL if full else REASON_IDLE)


class StaticPolicy(Policy):
    name = "static"

    def __init__(self, max_batch_rows: int = 64, max_queue_delay: float = 0.010) -> None:
        super().__init__(max_batch_rows)
        if max_queue_delay < 0:
            raise ValueError("max_queue_delay must be >= 0")
        self.max_queue_delay = max_queue_delay

    def decide(self, queue: RequestQueue, ctx: PolicyContext, now: float) -> Decision:
        max_rows = self.max_rows(ctx)
        ready: list[tuple[tuple, Hashable, str]] = []
        next_due: float | None = None
        for head in queue.heads():
            bucket = head.bucket
            if queue.bucket_rows(bucket) >= max_rows:
                ready.append((_fifo_key(head), bucket, REASON_FULL))
                continue
            due = queue.oldest_arrival(bucket) + self.max_queue_delay  # type: ignore[operator]
            if due <= now:
                ready.append((_fifo_key(head), bucket, REASON_LINGER))
            else:
                next_due = due if next_due is None else min(next_due, due)
        if ready:
            _, bucket, reason = min(ready, key=lambda r: r[0])
            return Dispatch(bucket, max_rows, reason)
        return Wait(next_due)

    def describe(self) -> dict:
        return {**super().describe(), "max_queue_delay_ms": self.max_queue_delay * 1e3}


class AdaptivePolicy(Policy):
    """Work-conserving EDF with a deadline-aware size cap and early drop.

    Early drop: a request leaves the model's path (to the batcher's late lane) when it
    could not finish in time in a batch of the size that keeps up with the load it
    competes with (its own priority level and the levels above). At low load that size
    is one request, so only truly hopeless requests go; under overload it is the max
    batch, so the executor never spends its time on small batches of nearly-expired
    requests (EDF's known collapse under overload) and runs full batches of requests
    that will make it. A full batch that has waited longer than one takes counts as
    overload too, whatever the rate says (see `hopeless`).

    Batch cap (batch_cap): the max where batching pays, as greedy; one request at a
    time where it does not (t(n) ≈ b·n), since there a bigger batch buys no throughput
    and only makes batch-mates wait for each other.

    hold_for_efficiency: when executor time has a price beyond this queue (a GPU shared
    with other models, cost per GPU-second), hold an idle executor until the batch is
    big enough that the executor would be busy at most `hold_utilization` of the time
    at the current arrival rate — never past the tightest request's slack, and never
    when batching does not pay. Off by default: with a dedicated executor, holding only
    adds latency.
    """

    name = "adaptive"
    ordering: Ordering = "edf"
    separates_late = True

    def __init__(
        self,
        max_batch_rows: int = 512,
        hold_for_efficiency: bool = False,
        safety: float = 0.2,
        hold_utilization: float = 0.5,
        keep_up_headroom: float = 1.1,
    ) -> None:
        super().__init__(max_batch_rows)
        if safety < 0:
            raise ValueError("safety must be >= 0")
        if not 0.0 < hold_utilization <= 1.0:
            raise ValueError("hold_utilization must be within (0, 1]")
        if keep_up_headroom < 1.0:
            raise ValueError("keep_up_headroom must be >= 1")
        self.hold_for_efficiency = hold_for_efficiency
        # Fraction of predicted service time kept in reserve against cost-model error.
        self.safety = safety
        self.hold_utilization = hold_utilization
        self.keep_up_headroom = keep_up_headroom

    def decide(self, queue: RequestQueue, ctx: PolicyContext, now: float) -> Decision:
        bucket = _first_bucket(queue, _edf_key)
        if bucket is None:
            return Wait(None)
        rows = queue.bucket_rows(bucket)
        max_rows = self.batch_cap(ctx, bucket, rows)
        if rows >= max_rows:
            return self._dispatch(queue, bucket, ctx, now, max_rows, REASON_FULL)
        if self.hold_for_efficiency and ctx.cost.cost(bucket).batching_pays():
            hold_until = self._hold_until(queue, bucket, ctx, now)
            if hold_until is not None and hold_until > now:
                return Wait(hold_until)
        return self._dispatch(queue, bucket, ctx, now, max_rows, REASON_IDLE)

    def _dispatch(
        self,
        queue: RequestQueue,
        bucket: Hashable,
        ctx: PolicyContext,
        now: float,
        max_rows: int,
        reason: str,
    ) -> Dispatch:
        """A dispatch whose `fits` caps the batch so its predicted service time (with the
        safety margin) ends before the tightest deadline in it."""
        cost = ctx.cost.cost(bucket)
        margin = 1.0 + self.safety
        pad = ctx.pad
        head = queue.head(bucket)
        assert head is not None
        tightest = [head.deadline]
        d = Dispatch(bucket, max_rows, reason)

        def fits(rows_after: int, req: Request) -> bool:
            deadline = min(tightest[0], req.deadline)
            if now + cost.predict(pad(rows_after)) * margin > deadline:
                d.reason = REASON_DEADLINE  # the cap, not the queue, closed this batch
                return False
            tightest[0] = deadline
            return True

        d.fits = fits
        return d

    def hopeless(self, req: Request, ctx: PolicyContext, now: float, queued_rows: int) -> bool:
        cost = ctx.cost.cost(req.bucket)
        margin = 1.0 + self.safety
        slack = req.deadline - now
        if cost.predict(ctx.pad(max(self.max_rows(ctx), req.rows))) * margin <= slack:
            return False  # would make it even in a full batch: the common case, no rates
        if cost.predict(ctx.pad(req.rows)) > slack:
            return True  # could not make it even alone
        # Early drop: the batch this request should ride is at least the keep-up size
        # for the load of its level and above — no bigger than the batch the policy
        # would form (batch_cap) nor than what is queued.
        cap = self.batch_cap(ctx, req.bucket, queued_rows)
        full = cost.predict(ctx.pad(cap)) * margin
        if queued_rows >= cap and now - req.arrival >= full:
            # A full batch waits and this request has waited longer than one takes: the
            # executor is behind, whatever the rate says (a burst that has just arrived
            # at an idle executor is not, and its tight requests still ride a small batch).
            # The keep-up size is set against the model's curve, while per-batch work
            # outside the model (collate, split, result documents, the GIL) holds the
            # real pipeline's throughput below it: without this rule adaptive kept
            # requests that needed small batches to make their deadlines and fell far
            # behind greedy at overload (measured: docs/BATCHING.md, "What it found,
            # and the fix: early drop when a full batch has waited").
            target = cap
        else:
            target = min(self.keep_up_rows(ctx, req.bucket, ctx.rate_upto(req.priority)), cap)
        rows = min(max(target, req.rows), max(queued_rows, req.rows))
        return cost.predict(ctx.pad(rows)) * margin > slack

    def batch_cap(self, ctx: PolicyContext, bucket: Hashable, queued_rows: int = 0) -> int:
        """The biggest batch worth forming now (work-conserving: it runs at once, the
        rest waits for the next free executor).

        Rows in one batch all wait for the whole batch. Where batching pays (the cost
        model's batching_pays(): GPU-like curves, the CTR model on CPU) the cap is the
        max, as greedy. Where it does not (t(n) ≈ b·n, a convolutional model on CPU), a
        bigger batch buys no throughput and only makes batch-mates wait for each
        other: serve one request at a time (a/b rows: splitting n rows into n1 + n2
        saves the n1 rows b·n2 and costs the n2 rows one more call overhead a, so it
        pays for n1 > a/b) — unless more than two of those are queued, where the
        executor is congested and throughput comes first (the size that reaches
        98 % of capacity, a few rows: see _CONGESTED_SHARE). Rate-driven caps for
        curves where batching pays were tried and measured, with no consistent gain
        (docs/BATCHING.md, "adaptive, rule by rule", rule 4)."""
        cost = ctx.cost.cost(bucket)
        max_rows = self.max_rows(ctx)
        if cost.batching_pays():
            return max_rows
        cap = max(1, math.ceil(cost.a / cost.b))
        if queued_rows > 2 * cap:
            capacity = max_rows / cost.predict(max_rows)
            cap = max(cap, _rows_for_rate(cost, _CONGESTED_SHARE * capacity, max_rows))
        return min(cap, max_rows)

    def keep_up_rows(
        self,
        ctx: PolicyContext,
        bucket: Hashable,
        rate: float | None = None,
        headroom: float | None = None,
    ) -> int:
        """Smallest n whose service rate n / t(n) matches the arrival rate times
        headroom: batches smaller than this fall behind under the current load."""
        lam = (ctx.arrival_rate if rate is None else rate) * (headroom or self.keep_up_headroom)
        return _rows_for_rate(ctx.cost.cost(bucket), lam, self.max_rows(ctx))

    def _hold_until(
        self, queue: RequestQueue, bucket: Hashable, ctx: PolicyContext, now: float
    ) -> float | None:
        # The size at which the executor is busy hold_utilization of the time.
        target = self.keep_up_rows(ctx, bucket, headroom=1.0 / self.hold_utilization)
        rows = queue.bucket_rows(bucket)
        if rows >= target or ctx.arrival_rate <= 0:
            return None
        deadline = queue.earliest_deadline(bucket)
        assert deadline is not None
        cost = ctx.cost.cost(bucket)
        # Latest start that still lets a target-sized batch finish before the tightest
        # deadline; spend slack up to there, never more.
        latest_start = deadline - cost.predict(ctx.pad(target)) * (1.0 + self.safety)
        # Expected time for a target-sized batch to accumulate, counted from the oldest
        # queued arrival (not from now: a hold re-examined at its wake-up must not
        # re-arm itself); no point holding longer when the rows did not come.
        oldest = queue.oldest_arrival(bucket)
        assert oldest is not None
        fill_by = oldest + target / ctx.arrival_rate
        until = min(latest_start, fill_by)
        return until if until > now else None

    def describe(self) -> dict:
        out = {
            **super().describe(),
            "hold_for_efficiency": self.hold_for_efficiency,
        }
        if self.hold_for_efficiency:
            out["hold_utilization"] = self.hold_utilization
        return out
