"""The asyncio driver of the Faust batching helper: ``AdaptiveBatches`` iterates
``FaustBatch`` over a Faust stream, around a pure ``BatchingCore`` (pipeline/faust/core.py).

Faust's own ``stream.take(max_, within=...)`` has a fixed batch size, a timer that
restarts with every wait instead of counting from the oldest event, and an ack of the
whole buffer in a ``finally`` -- a batch body that raises is acknowledged anyway. Here:

- events are taken with manual acks (``stream.noack()``) as they come, also while a
  body runs, so linger and queue wait count from each event's real arrival; the
  policy picks size and linger, and the cost model learns from how long each body took
  (yield to the next iteration, or ``batch.service_seconds`` when the body reports it);
- events are acknowledged only when the loop asks for the next batch, i.e. after the
  body returned -- or, when the body handed the batch awaitables with
  ``batch.defer_ack(...)``, once those completed -- and in offset order per partition
  (pipeline/faust/acks.py). A body that raises leaves its events unacked: they are
  processed again after a restart (at-least-once, like the worker).

Faust is never imported: only the stream's ``noack()``, ``events()`` and ``ack(event)``
and the events' ``message`` attributes are used (pipeline/faust/events.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Any

from pipeline.batching.request import Batch
from pipeline.clock import Clock, MonotonicClock, wall_ms
from pipeline.faust.acks import ack_gate_for
from pipeline.faust.batch import REASON_REJECTED, REASON_ROUTED_LATE, FaustBatch, Rejected
from pipeline.faust.core import BatchingCore, Pending
from pipeline.faust.events import event_position, event_topic, kafka_timestamp_ms
from pipeline.faust.tenants import TenantOutcomes, count_outcomes, tenant_of
from pipeline.observe.metrics import BatchingMetrics

# Named after the public entry point, as before the split: logging set up for
# "pipeline.faust.batching" keeps seeing the driver's warnings.
log = logging.getLogger("pipeline.faust.batching")

# The worker's batching metrics (same names, labels and buckets): offsets, lag and
# commits belong to Faust here (its sensors and web pages), so they are not repeated.
BatchMetrics = BatchingMetrics

PrepareFn = Callable[[Any], Any]


class AdaptiveBatches:
    """Async iterator of FaustBatch over a Faust stream (see adaptive_batches())."""

    def __init__(
        self,
        stream: Any,
        core: BatchingCore,
        *,
        rows: Callable[[Any], int] | None = None,
        prepare: PrepareFn | None = None,
        priority: Callable[[Any], int] | None = None,
        bucket: Callable[[Any], Hashable] | None = None,
        deadline_ms: Callable[[Any], float | None] | None = None,
        tenant: Callable[[Any], str | None] | None = None,
        max_queued_rows: int = 20_000,
        max_pending_acks: int = 16,
        metrics: BatchMetrics | None = None,
        tenant_outcomes: TenantOutcomes | None = None,
        clock: Clock | None = None,
        wall_clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        if max_queued_rows < 1:
            raise ValueError("max_queued_rows must be >= 1")
        if max_pending_acks < 1:
            raise ValueError("max_pending_acks must be >= 1")
        self.core = core
        self.metrics = metrics
        self.clock = clock or MonotonicClock()
        self._wall_ms = wall_clock_ms
        # Manual acks: Faust then leaves each event unacked after it is yielded and
        # commits only offsets we ack through this stream (noack() is the public way;
        # take()/take_events() would ack the whole buffer in a finally).
        self._source = stream.noack() if hasattr(stream, "noack") else stream
        self._app = getattr(stream, "app", None)
        self._gate = ack_gate_for(self._app)
        self._rows = rows
        self._prepare = prepare
        self._priority = priority
        self._bucket = bucket
        self._deadline_ms = deadline_ms
        self._tenant, self._tenant_outcomes = tenant, tenant_outcomes  # pipeline/faust/tenants.py
        self._max_queued_rows = max_queued_rows
        self._max_pending_acks = max_pending_acks
        self._reader: asyncio.Task[None] | None = None
        self._reader_done = False
        self._reader_error: BaseException | None = None
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._offered = 0
        self._rejected: list[Rejected] = []
        self._drained: list[Batch] = []
        self._current: FaustBatch | None = None
        self._pending_acks: set[asyncio.Task[None]] = set()
        self._ack_error: BaseException | None = None
        self._closed = False
        self._owner: asyncio.Task[Any] | None = None

    # -- async iterator protocol ----------------------------------------------------
    def __aiter__(self) -> AdaptiveBatches:
        return self

    async def __aenter__(self) -> AdaptiveBatches:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> FaustBatch:
        if self._closed:
            raise StopAsyncIteration
        # Coming back here means the body of the previous batch returned: settle it.
        await self._settle_previous()
        self._start()
        await self._limit_pending_acks()
        self._raise_failures()
        # A body that did not await anything kept the reader from running; let it
        # take what Faust already buffered before deciding, so the batch sees it.
        await self._catch_up()
        while True:
            self._raise_failures()
            now = self.clock.now()
            batch = self._drained.pop(0) if self._drained else self.core.next_batch(now)
            routed = self.core.pop_routed_late()
            if batch is not None or routed or self._rejected:
                return self._emit(batch, routed, now)
            if self._reader_done:
                if len(self.core):
                    self._drained = self.core.drain(now)
                    continue
                self._closed = True
                raise StopAsyncIteration
            wake = self.core.next_wakeup()
            timeout = None if wake is None else max(0.0, wake - self.clock.now())
            # Single-threaded loop: nothing can set _wake between clear() and wait().
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def aclose(self) -> None:
        """Stop reading. The batch being processed (if any) is NOT acknowledged: an
        iteration abandoned half-way is treated like a failed body."""
        self._shutdown()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        for task in list(self._pending_acks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- internals ----------------------------------------------------------------
    def _start(self) -> None:
        if self._reader is not None:
            return
        self._reader = asyncio.ensure_future(self._read())
        owner = asyncio.current_task()
        if owner is not None:
            # When the agent's task ends -- its body raised, or Faust stopped it --
            # stop reading at once, without waiting for this object to be collected:
            # events still buffered here are dropped unacked (replayed after restart).
            self._owner = owner
            owner.add_done_callback(lambda _t: self._shutdown())

    def _shutdown(self) -> None:
        if self._closed and self._reader is None:
            return
        self._closed = True
        if self._current is not None and self._current._core_batch is not None:
            lost = self.core.fail(self._current._core_batch)
            if lost:
                log.warning(
                    "batch of %d events not acknowledged (body raised or iteration "
                    "abandoned); they are delivered again after a restart", len(lost),
                )
        self._current = None
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        self._wake.set()
        self._space.set()

    async def _read(self) -> None:
        """Take events from the stream into the core as they come (also while a body
        runs), so that linger and queue wait count from each event's real arrival."""
        try:
            async for event in self._source.events():
                self._admit(event)
                while self.core.queued_rows >= self._max_queued_rows and not self._closed:
                    # Backpressure: stop taking; Faust's own buffer then fills and it
                    # pauses fetching (stream_buffer_maxsize).
                    self._space.clear()
                    await self._space.wait()
                if self._closed:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced by __anext__ in the agent's task
            self._reader_error = exc
        finally:
            self._reader_done = True
            self._wake.set()

    def _admit(self, event: Any) -> None:
        tp, offset, generation = event_position(event)
        self._gate.taken(tp, offset, generation)
        try:
            value = event.value
            prepared = self._prepare(event) if self._prepare is not None else value
            basis = prepared
            rows = self._rows(basis) if self._rows is not None else int(getattr(prepared, "rows", 1) or 1)
            priority = self._priority(basis) if self._priority is not None else int(getattr(prepared, "priority", 0) or 0)
            bucket = self._bucket(basis) if self._bucket is not None else getattr(prepared, "bucket", 0)
            deadline = self._deadline_ms(basis) if self._deadline_ms is not None else getattr(prepared, "deadline_ms", None)
            tenant = self._tenant(basis) if self._tenant is not None else tenant_of(prepared)
            if int(rows) < 1:
                raise ValueError(f"an event must have at least 1 row, got {rows}")
        except Exception as exc:  # invalid input: the body dead-letters it
            self._rejected.append(Rejected(event, exc))
            self._wake.set()
            return
        self.core.offer(
            event,
            now=self.clock.now(),
            now_wall_ms=self._wall_ms(),
            rows=int(rows),
            timestamp_ms=kafka_timestamp_ms(event),
            prepared=prepared,
            priority=int(priority),
            bucket=bucket,
            deadline_ms=deadline,
            tenant=None if tenant is None else str(tenant),
        )
        self._offered += 1
        if self.metrics is not None:
            self.metrics.queue_rows.labels(self.metrics.pipeline).set(self.core.queued_rows)
        self._wake.set()

    async def _catch_up(self, max_rounds: int = 10_000) -> None:
        """Yield to the loop until the reader stops making progress: Faust hands one
        buffered event per loop iteration, so after a body that blocked the loop this
        takes what has piled up (the worker's poll of up to 1000 records)."""
        if self._reader is None or self._reader_done:
            return
        idle = 0
        for _ in range(max_rounds):
            before = self._offered + len(self._rejected)
            await asyncio.sleep(0)
            if self._offered + len(self._rejected) == before:
                idle += 1
                if idle >= 2:
                    return
            else:
                idle = 0
            if self.core.queued_rows >= self.core.batcher.max_batch_rows:
                return

    def _emit(self, batch: Batch | None, routed: list[Pending], now: float) -> FaustBatch:
        items: list[Pending] = []
        if batch is not None:
            items = [r.item for r in batch.requests]
            stale = [p for p in items if self._is_stale(p.event)]
            if stale:
                # Consumed before a rebalance: Faust seeks to the committed offsets
                # and delivers these again under the new generation, so processing
                # them now would only duplicate work. Dropped, not acked.
                items = [p for p in items if not self._is_stale(p.event)]
                batch.requests = [r for r in batch.requests if r.item in items]
                batch.rows = sum(p.rows for p in items)
                log.info("dropped %d events consumed before a rebalance", len(stale))
        rejected, self._rejected = self._rejected, []
        if batch is not None:
            reason = batch.reason
        elif rejected:
            reason = REASON_REJECTED
        else:
            reason = REASON_ROUTED_LATE
        fb = FaustBatch(
            items=items,
            reason=reason,
            rows=sum(p.rows for p in items),
            pad_to_rows=batch.pad_to_rows if batch is not None else None,
            formed_at=now,
            formed_wall_ms=self._wall_ms(),
            late=bool(batch is not None and batch.late),
            rejected=rejected,
            routed_late=routed,
            _core_batch=batch,
        )
        m = self.metrics
        if m is not None and items:
            m.batches.labels(m.pipeline, m.policy, fb.reason).inc()
            m.batch_rows.labels(m.pipeline, m.policy).observe(fb.rows)
            for p in items:
                m.queue_wait.labels(m.pipeline).observe(max(now - p.arrival, 0.0))
            m.queue_rows.labels(m.pipeline).set(self.core.queued_rows)
        if self.core.queued_rows < self._max_queued_rows:
            self._space.set()
        fb._yielded_at = self.clock.now()
        self._current = fb
        return fb

    def _is_stale(self, event: Any) -> bool:
        app = self._app
        gen = getattr(getattr(event, "message", None), "generation_id", None)
        current = getattr(app, "consumer_generation_id", None) if app is not None else None
        return gen is not None and current is not None and gen != current

    async def _settle_previous(self) -> None:
        fb, self._current = self._current, None
        if fb is None:
            return
        seconds = fb.service_seconds
        if seconds is None:
            seconds = self.clock.now() - fb._yielded_at
        done = self.core.complete(fb._core_batch, seconds) if fb._core_batch is not None else []
        if self.metrics is not None and done:
            self.metrics.inference.labels(self.metrics.pipeline).observe(seconds)
        if fb._deferred:
            task = asyncio.ensure_future(self._ack_after(fb, done))
            self._pending_acks.add(task)
            task.add_done_callback(self._pending_acks.discard)
        else:
            await self._ack_all(fb, done)

    async def _ack_after(self, fb: FaustBatch, done: list[Pending]) -> None:
        try:
            await asyncio.gather(*fb._deferred)
        except Exception as exc:
            log.error(
                "a deferred send of a batch of %d events failed (%s); they stay unacked",
                len(done) + len(fb.rejected) + len(fb.routed_late), exc,
            )
            self._ack_error = exc
            self._wake.set()
            return
        await self._ack_all(fb, done)

    async def _ack_all(self, fb: FaustBatch, done: list[Pending]) -> None:
        done_wall = self._wall_ms()
        counts: dict[tuple[str, str], int] = {}
        outcome_of = {id(p): fb.outcomes[i] for i, p in enumerate(fb.items) if i in fb.outcomes}
        acked: list[tuple[Pending, str]] = []
        for p in done:
            outcome = outcome_of.get(id(p)) or ("late" if done_wall > p.deadline_wall_ms else "ok")
            await self._ack(p.event, outcome, counts)
            acked.append((p, outcome))
            if self.metrics is not None and p.timestamp_ms is not None:
                self.metrics.e2e.labels(self.metrics.pipeline).observe(max(done_wall - p.timestamp_ms, 0.0) / 1000.0)
        for r in fb.rejected:
            await self._ack(r.event, "dlq", counts)
        for p in fb.routed_late:
            await self._ack(p.event, "routed_late", counts)
        if self.metrics is not None:
            for (topic, outcome), n in counts.items():
                self.metrics.outcome(topic, outcome, n)
        if self._tenant_outcomes is not None:
            count_outcomes(self._tenant_outcomes, acked, fb.routed_late, done_wall)

    async def _ack(self, event: Any, outcome: str, counts: dict[tuple[str, str], int]) -> None:
        key = (event_topic(event), outcome)
        counts[key] = counts.get(key, 0) + 1
        tp, offset, generation = event_position(event)
        if self._is_stale(event):
            return  # consumed before a rebalance: Faust delivers it again
        released = self._gate.done(tp, offset, (self._source, event), generation)
        # Through the stream that took each event, as Faust's own take() does: that
        # also feeds Faust's sensors (events out, the per-stream stats it serves).
        for source, ev in released:
            await source.ack(ev)
        held = self._gate.held(tp)
        if held and held % 10_000 == 0:
            log.error(
                "%d acks of %s[%d] held behind offsets that failed; commits are stuck "
                "until a restart or rebalance replays them", held, tp[0], tp[1],
            )

    async def _limit_pending_acks(self) -> None:
        while len(self._pending_acks) >= self._max_pending_acks:
            await asyncio.wait(set(self._pending_acks), return_when=asyncio.FIRST_COMPLETED)

    def _raise_failures(self) -> None:
        if self._ack_error is not None:
            exc, self._ack_error = self._ack_error, None
            self._shutdown()
            raise exc
        if self._reader_error is not None:
            exc2, self._reader_error = self._reader_error, None
            self._shutdown()
            raise exc2


# Keep the AsyncIterator ABC honest for type checkers.
AsyncIterator.register(AdaptiveBatches)
