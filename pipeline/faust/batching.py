"""Adaptive micro-batches inside Faust agents, driven by the same batching core as the
worker (pipeline/batching: policy + cost model + late lane).

Faust's own ``stream.take(max_, within=...)`` has three problems for model serving:
a fixed batch size, a timer that restarts with every wait instead of counting from the
oldest event (so an event can wait up to ``within`` after *any* flush), and an ack of
the whole buffer in a ``finally`` -- a batch body that raises is acknowledged anyway
and its events are never processed again. Here instead::

    @app.agent(requests)
    async def score(stream):
        async for batch in adaptive_batches(stream, policy="adaptive", slo_ms=100,
                                            max_batch_rows=512, rows=lambda v: 1):
            await do_something(batch.values)      # the batch body

- size and linger come from the policy (``adaptive`` by default: work-conserving,
  earliest deadline first, a batch cap that keeps the tightest deadline); the cost
  model learns from how long each body took (the time from yielding a batch to the
  next iteration, or ``batch.service_seconds`` when the body reports it);
- each event's deadline is its Kafka timestamp (``event.message.timestamp``) plus the
  SLO (tightened by a codec's own ``deadline_ms``);
- events are taken with manual acks (``stream.noack()``) and acknowledged only when the
  loop asks for the next batch, i.e. after the body returned -- or, when the body
  handed the batch awaitables with ``batch.defer_ack(...)`` (result sends), once those
  completed. A body that raises leaves its events unacked: Faust commits only the
  contiguous acked prefix of each partition, so they are processed again after a
  restart (at-least-once, like the worker).

The module has two layers. ``BatchingCore`` is pure (no Faust, no asyncio, no clock of
its own): offer events, ask for batches, report success or failure; it is what the unit
tests drive with a fake clock. ``AdaptiveBatches`` is the asyncio driver around a Faust
stream. Faust is never imported here: the driver only uses the stream's ``noack()``,
``events()`` and ``ack(event)`` and the events' ``message`` attributes, so the core
and its tests run without Faust installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import CostModel
from pipeline.batching.policies import make_policy
from pipeline.batching.policies import policy_params as make_policy_params
from pipeline.batching.request import Batch, Request
from pipeline.clock import Clock, ClockAnchor, MonotonicClock, wall_ms
from pipeline.metrics import BatchingMetrics

log = logging.getLogger(__name__)

# Reasons of batches that carry no model work (their events still need acks).
REASON_REJECTED = "rejected"
REASON_ROUTED_LATE = "routed_late"


# ----------------------------------------------------------------------------- core
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
        return [r.item for r in self.batcher.pop_routed_late()]

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


# ----------------------------------------------------------------------------- ack gate
PartitionKey = tuple[str, int]


@dataclass
class _PartitionAcks:
    generation: Any
    outstanding: list[int] = field(default_factory=list)  # heap of taken, unacked offsets
    done: dict[int, Any] = field(default_factory=dict)  # offset -> payload, waiting for the head


class AckGate:
    """Hands acks to Faust in offset order per partition: an offset is released only
    when every offset taken before it on that partition is done.

    Why: Faust commits "the first run of consecutive acked offsets", and its check for
    a gap at the head of that run is skipped while a partition has no committed offset
    (or it is 0), and misses a gap of exactly one offset (faust-streaming 0.15.3,
    Consumer._new_offset). So acking the events after a failed batch let Faust commit
    straight past it -- measured: 200 committed with offsets 0-20 never processed. Held
    back here, Faust's acked list never has a gap: the commit stops at the first offset
    not done, whatever Faust's check does.

    Pure: payloads are opaque (the driver stores (stream, event) pairs). One gate per
    Faust app, shared by its agents' drivers and kept across agent restarts, so a
    failed batch of a crashed agent instance still holds the later acks back. A new
    consumer generation (rebalance: Faust seeks back to the committed offsets and
    delivers everything again) starts each partition afresh; acks of the old
    generation are dropped, not released.
    """

    def __init__(self) -> None:
        self._parts: dict[PartitionKey, _PartitionAcks] = {}

    def taken(self, tp: PartitionKey, offset: int, generation: Any = None) -> None:
        part = self._parts.get(tp)
        if part is None or part.generation != generation:
            part = self._parts[tp] = _PartitionAcks(generation)
        heapq.heappush(part.outstanding, offset)

    def done(self, tp: PartitionKey, offset: int, payload: Any, generation: Any = None) -> list[Any]:
        """Mark an offset done; returns the payloads now releasable, in offset order."""
        part = self._parts.get(tp)
        if part is None or part.generation != generation:
            return []  # taken under an older generation: Faust delivers it again
        part.done[offset] = payload
        out = []
        heap = part.outstanding
        while heap and heap[0] in part.done:
            out.append(part.done.pop(heapq.heappop(heap)))
        return out

    def held(self, tp: PartitionKey | None = None) -> int:
        """Done offsets waiting behind one that is not (all partitions when tp is None)."""
        parts = self._parts.values() if tp is None else [p for k, p in self._parts.items() if k == tp]
        return sum(len(p.done) for p in parts)

    def forget(self, tp: PartitionKey, offset: int, generation: Any = None) -> None:
        """An offset that will never be done in this generation stops blocking
        (only for offsets Faust will deliver again anyway)."""
        part = self._parts.get(tp)
        if part is None or part.generation != generation or offset not in part.outstanding:
            return
        part.outstanding.remove(offset)
        heapq.heapify(part.outstanding)


_GATES: weakref.WeakKeyDictionary[Any, AckGate] = weakref.WeakKeyDictionary()


def ack_gate_for(app: Any) -> AckGate:
    """The gate shared by every driver of one Faust app (a new one without an app)."""
    if app is None:
        return AckGate()
    try:
        gate = _GATES.get(app)
        if gate is None:
            gate = _GATES[app] = AckGate()
        return gate
    except TypeError:  # not weak-referenceable: per driver
        return AckGate()


# ----------------------------------------------------------------------------- metrics
# The worker's batching metrics (same names, labels and buckets): offsets, lag and
# commits belong to Faust here (its sensors and web pages), so they are not repeated.
BatchMetrics = BatchingMetrics


# ----------------------------------------------------------------------------- driver
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


PrepareFn = Callable[[Any], Any]


def _faust_timestamp_ms(event: Any) -> float | None:
    """Faust messages carry the Kafka timestamp in seconds (a float)."""
    ts = getattr(getattr(event, "message", None), "timestamp", None)
    return float(ts) * 1000.0 if ts else None


def _event_topic(event: Any) -> str:
    return str(getattr(getattr(event, "message", None), "topic", "") or "")


def _position(event: Any) -> tuple[PartitionKey, int, Any]:
    """(topic, partition), offset and consumer generation of a Faust event."""
    m = event.message
    return (str(m.topic), int(m.partition)), int(m.offset), getattr(m, "generation_id", None)


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
        max_queued_rows: int = 20_000,
        max_pending_acks: int = 16,
        metrics: BatchMetrics | None = None,
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
        tp, offset, generation = _position(event)
        self._gate.taken(tp, offset, generation)
        try:
            value = event.value
            prepared = self._prepare(event) if self._prepare is not None else value
            basis = prepared
            rows = self._rows(basis) if self._rows is not None else int(getattr(prepared, "rows", 1) or 1)
            priority = self._priority(basis) if self._priority is not None else int(getattr(prepared, "priority", 0) or 0)
            bucket = self._bucket(basis) if self._bucket is not None else getattr(prepared, "bucket", 0)
            deadline = self._deadline_ms(basis) if self._deadline_ms is not None else getattr(prepared, "deadline_ms", None)
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
            timestamp_ms=_faust_timestamp_ms(event),
            prepared=prepared,
            priority=int(priority),
            bucket=bucket,
            deadline_ms=deadline,
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
        for p in done:
            outcome = outcome_of.get(id(p)) or ("late" if done_wall > p.deadline_wall_ms else "ok")
            await self._ack(p.event, outcome, counts)
            if self.metrics is not None and p.timestamp_ms is not None:
                self.metrics.e2e.labels(self.metrics.pipeline).observe(
                    max(done_wall - p.timestamp_ms, 0.0) / 1000.0
                )
        for r in fb.rejected:
            await self._ack(r.event, "dlq", counts)
        for p in fb.routed_late:
            await self._ack(p.event, "routed_late", counts)
        if self.metrics is not None:
            for (topic, outcome), n in counts.items():
                self.metrics.outcome(topic, outcome, n)

    async def _ack(self, event: Any, outcome: str, counts: dict[tuple[str, str], int]) -> None:
        key = (_event_topic(event), outcome)
        counts[key] = counts.get(key, 0) + 1
        tp, offset, generation = _position(event)
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


def adaptive_batches(
    stream: Any,
    policy: str = "adaptive",
    slo_ms: float = 100.0,
    max_batch_rows: int = 512,
    rows: Callable[[Any], int] | None = None,
    *,
    prepare: PrepareFn | None = None,
    priority: Callable[[Any], int] | None = None,
    bucket: Callable[[Any], Hashable] | None = None,
    deadline_ms: Callable[[Any], float | None] | None = None,
    max_queue_delay_ms: float = 10.0,
    policy_params: dict[str, Any] | None = None,
    cost_model: CostModel | None = None,
    expiry_action: str = "score_late",
    late_share: float = 0.05,
    allowed_batch_sizes: Sequence[int] | None = None,
    max_queued_rows: int = 20_000,
    max_pending_acks: int = 16,
    metrics: BatchMetrics | None = None,
    clock: Clock | None = None,
) -> AdaptiveBatches:
    """Adaptive batches of a Faust agent's stream; use as ``async for batch in ...``.

    rows/priority/bucket/deadline_ms are functions of the event's value -- or of what
    ``prepare(event)`` returned when ``prepare`` is given (e.g. a codec's decode: then
    the defaults read ``.rows``, ``.priority``, ``.bucket`` and ``.deadline_ms`` of
    the prepared object, which is what ``consumers.codecs`` Decoded carries). An event
    whose prepare() raises is passed to the body in ``batch.rejected``.

    ``cost_model`` seeds what a batch costs (e.g. from a warm-up profile); it then
    learns from every body's time. Policies and their parameters are the worker's
    (docs/BATCHING.md); ``max_queued_rows`` bounds the rows held here (backpressure).
    """
    core = make_core(
        policy,
        slo_ms=slo_ms,
        max_batch_rows=max_batch_rows,
        max_queue_delay_ms=max_queue_delay_ms,
        policy_params=policy_params,
        cost_model=cost_model,
        expiry_action=expiry_action,
        late_share=late_share,
        allowed_batch_sizes=allowed_batch_sizes,
    )
    if rows is None and prepare is None:
        rows = _one_row
    return AdaptiveBatches(
        stream,
        core,
        rows=rows,
        prepare=prepare,
        priority=priority,
        bucket=bucket,
        deadline_ms=deadline_ms,
        max_queued_rows=max_queued_rows,
        max_pending_acks=max_pending_acks,
        metrics=metrics,
        clock=clock,
    )


def _one_row(_value: Any) -> int:
    return 1


__all__ = [
    "AckGate",
    "AdaptiveBatches",
    "BatchMetrics",
    "BatchingCore",
    "FaustBatch",
    "Pending",
    "Rejected",
    "ack_gate_for",
    "adaptive_batches",
    "make_core",
]

# Keep the AsyncIterator ABC honest for type checkers.
AsyncIterator.register(AdaptiveBatches)
