"""Thread-safe face of the Batcher for the worker: the source thread puts requests,
executor threads block for batches. All decisions stay in the pure Batcher; this
module only adds a lock, a condition variable and the clock."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import AffineCost
from pipeline.batching.depth import PipelineDepth
from pipeline.batching.request import Batch, Request
from pipeline.clock import Clock, MonotonicClock

# Upper bound on a blocking wait, so a closed queue is noticed promptly even when the
# policy has no timer pending.
_MAX_WAIT = 0.05


class BatchQueue:
    def __init__(
        self,
        batcher: Batcher,
        clock: Clock | None = None,
        high_watermark_rows: int = 20_000,
        low_watermark_rows: int | None = None,
        depth: PipelineDepth | None = None,
    ) -> None:
        if high_watermark_rows < 1:
            raise ValueError("high_watermark_rows must be >= 1")
        low = high_watermark_rows // 2 if low_watermark_rows is None else low_watermark_rows
        if not 0 <= low < high_watermark_rows:
            raise ValueError("low_watermark_rows must be in [0, high_watermark_rows)")
        self.batcher = batcher
        self.clock = clock or MonotonicClock()
        self.high_watermark_rows = high_watermark_rows
        self.low_watermark_rows = low
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        # Executors held back by the depth wait here, not on _cond: the requests that
        # put_many announces are not theirs to take, and waking them all on every poll
        # cost the calm path GIL hand-overs (and latency).
        self._gate = threading.Condition(lock)
        self._closed = False
        self._abandoned = False
        self._busy_executors = 0
        self._waiting_for_batch = 0  # executors past the depth gate, waiting for requests
        self._next_seq = 0
        # None: every executor may hold a batch at once (each runs the model itself).
        self.depth = depth
        self._drained: list[Batch] = []

    def now(self) -> float:
        return self.clock.now()

    def _at_depth_limit(self) -> bool:
        """Under the lock: may no further batch be dispatched now? (Also moves the
        depth's mode with the queue.)"""
        if self.depth is None:
            return False
        self._update_depth()
        # Counts the executors already waiting for requests too: while calm, only one
        # waits on _cond, the others on the gate. With all of them on _cond, every
        # poll's notify_all woke four threads to find one batch, and with a 0.1 ms
        # switch interval that churn of GIL hand-overs doubled latency at half load.
        taken = self._busy_executors + self._waiting_for_batch
        return taken >= self.depth.in_flight and not self._closed

    def _update_depth(self) -> None:
        if self.depth is not None and self.depth.update(self.batcher.backpressure_rows):
            self._gate.notify_all()  # backlogged: the held-back executors may go

    def put(self, req: Request) -> None:
        with self._cond:
            self.batcher.add(req, self.clock.now())
            self._cond.notify()

    def put_many(self, reqs: list[Request]) -> None:
        """One lock round for a whole poll's worth of requests."""
        with self._cond:
            now = self.clock.now()
            for req in reqs:
                self.batcher.add(req, now)
            self._update_depth()
            self._cond.notify_all()

    def over_share(self, tenants: Sequence[str | None], now: float) -> list[bool]:
        """Per tenant id, whether its class is over its share (TenantGate.over_share),
        under the lock the batcher's gate is updated under; all False without a gate."""
        gate = self.batcher.tenants
        if gate is None:
            return [False] * len(tenants)
        with self._cond:
            return [gate.over_share(t, now) for t in tenants]

    def get_batch(self) -> Batch | None:
        """Block until the policy dispatches a batch; None once closed and empty."""
        with self._cond:
            while True:
                if self._abandoned:
                    return None
                now = self.clock.now()
                if self._at_depth_limit():
                    self._gate.wait(_MAX_WAIT)
                    continue
                batch = self.batcher.next_batch(now)
                if batch is not None:
                    return self._dispatch(batch)
                if self._closed:
                    # Shutting down: no point waiting for a linger timer; flush what is left.
                    if not self._drained:
                        self._drained = self.batcher.drain(now)
                    if not self._drained:
                        return None
                    return self._dispatch(self._drained.pop(0))
                wake = self.batcher.next_wakeup()
                timeout = _MAX_WAIT if wake is None else min(max(wake - now, 0.0), _MAX_WAIT)
                self._waiting_for_batch += 1
                try:
                    self._cond.wait(timeout)
                finally:
                    self._waiting_for_batch -= 1

    def _dispatch(self, batch: Batch) -> Batch:
        self._busy_executors += 1
        batch.seq = self._next_seq
        self._next_seq += 1
        return batch

    def done(self, batch: Batch, seconds: float) -> None:
        """An executor finished a batch: feed the cost model."""
        with self._cond:
            self._busy_executors -= 1
            self.batcher.observe(batch, seconds)
            self._cond.notify()
            if self.backlogged:  # calm: this executor comes back for the next batch itself
                self._gate.notify()

    def restart_cost(self, prior: AffineCost) -> None:
        """A new model version serves: its warm-up profile replaces what the cost model
        learnt of the old one (pipeline/versions/manager.py)."""
        with self._cond:
            self.batcher.cost.restart(prior)

    def pop_routed_late(self) -> list[Request]:
        with self._cond:
            return self.batcher.pop_routed_late()

    @property
    def at_depth_limit(self) -> bool:
        """Would a free executor be held back now (batching/depth.py)?"""
        with self._cond:
            return self._at_depth_limit()

    @property
    def backlogged(self) -> bool:
        """The depth's mode (always False without one)."""
        return self.depth is not None and self.depth.backlogged

    @property
    def rows(self) -> int:
        """Rows held in memory (in-time queue + late lane)."""
        with self._cond:
            return self.batcher.rows

    @property
    def backpressure_rows(self) -> int:
        """Rows the watermarks count (Batcher.backpressure_rows says which)."""
        with self._cond:
            return self.batcher.backpressure_rows

    def above_high_watermark(self) -> bool:
        """Hold intake: backpressure_rows reached high_watermark_rows."""
        return self.backpressure_rows >= self.high_watermark_rows

    def below_low_watermark(self) -> bool:
        """Resume the Kafka partitions."""
        return self.backpressure_rows <= self.low_watermark_rows

    def close(self) -> None:
        """Executors get what is still queued as drain batches, then None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._gate.notify_all()

    def abandon(self) -> None:
        """Executors get None from now on: what is still queued stays without an
        outcome (the drain time ran out; its offsets are not committed, so the
        partitions' next owner scores it)."""
        with self._cond:
            self._closed = True
            self._abandoned = True
            self._cond.notify_all()
            self._gate.notify_all()

