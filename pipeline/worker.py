"""One tidebatch worker: a consumer-group member that decodes requests, batches them,
runs the model and publishes one outcome per request.

Threads (DESIGN.md "Data flow in one worker"):
- the source thread (the caller of run()) polls Kafka, decodes, queues requests,
  routes bad input to the DLQ, serves producer delivery reports, applies
  backpressure and commits offsets. It never waits for a result: many requests are
  in flight at once, or no batch could ever form.
- executor threads (runtime.executors, one batch in flight each) take batches from
  the BatchQueue, collate them, have the model run them and hand the outputs to the
  publisher. ONNX Runtime runs on the executor thread itself (it releases the GIL),
  or with runtime.model_process in a process of its own (runtime/model_process.py),
  where the model never waits for this process's GIL.
- the publisher thread builds the result documents, produces them and hands the rows
  to the sinks, in dispatch order (reorder.py). Off the executors, so that this
  Python work (about a fifth of an in-process executor's time at saturation) never
  delays the model's next batch.

Delivery: at-least-once. Each consumed offset is tracked; it is done when every sink
has acknowledged its outcome; each partition commits its contiguous done watermark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from consumers.codecs.base import Decoded, DecodeError, decode_all
from consumers.dead_letter import record_bytes
from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord, TopicPartition
from pipeline.batching.backpressure import Backpressure, Intake, IntakeDecision
from pipeline.batching.batcher import Batcher
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.cost import CostModel
from pipeline.batching.depth import PipelineDepth
from pipeline.batching.policies import make_policy
from pipeline.batching.request import Batch, Request
from pipeline.clock import Clock, MonotonicClock, wall_ms
from pipeline.config import WorkerConfig
from pipeline.hooks import WorkerHook
from pipeline.kafka_backend import make_producer, make_source
from pipeline.limits import Limits, resolve_limits
from pipeline.metrics import WorkerMetrics, observe_many
from pipeline.outcomes import Outcomes, Topics
from pipeline.pipelines import get_pipeline
from pipeline.reorder import Reorder
from pipeline.runtime import affinity, allocator, interpreter
from pipeline.runtime.model_process import ProcessSession
from pipeline.runtime.session import InferenceSession
from pipeline.sinks import ResultSink, ScoredRow, notify

log = logging.getLogger(__name__)

_POLL_RECORDS = 1000
_POLL_TIMEOUT = 0.02
_PUBLISH_BACKLOG = 4  # finished batches waiting for the publisher before executors wait
_HOLD_WAIT = 0.005  # s; how long a holding source loop waits for acks per turn
_REVOKE_WAIT = 10.0
_HANDOFF_WAIT = 0.1  # s; an executor re-checks the publisher this often while handing over
_LAG_INTERVAL = 1.0
# Kafka timestamps map to the batcher's clock through one fixed anchor (see
# _clock_anchor); a drift beyond this between the two clocks is a wall-clock step.
_ANCHOR_DRIFT_S = 0.02


@dataclass(slots=True)
class InFlight:
    """What an executor needs to finish one request."""

    rec: SourceRecord
    decoded: Decoded
    deadline_wall_ms: float
    consumed_wall_ms: int


@dataclass(slots=True)
class _Finished:
    """A batch the model has run, on its way to the publisher thread."""

    batch: Batch
    results: list[dict] | None
    batch_rows: int
    seconds: float
    started_wall: int
    is_batch: bool = True  # False: one request re-run alone after its batch failed


@dataclass(slots=True)
class _Done:
    """What an executor hands the publisher for one dispatched batch: its results as
    one part, or one part per request re-run alone, or none (all dead-lettered)."""

    seq: int
    parts: list[_Finished]


class _BeforeOutcomes(Exception):
    """Publishing a part failed before any of its requests had an outcome."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class WorkerStats:
    consumed: int = 0
    scored: int = 0
    scored_late: int = 0
    routed_late: int = 0
    dlq: int = 0
    undeliverable: int = 0  # no outcome could be written (limits.on_undeliverable: skip)
    duplicates: int = 0
    batches: int = 0
    batch_rows: int = 0
    commits: int = 0
    pauses: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Worker:
    def __init__(
        self,
        cfg: WorkerConfig,
        *,
        clock: Clock | None = None,
        sinks: list[ResultSink] | None = None,
        hooks: list[WorkerHook] | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock or MonotonicClock()
        self.pipeline = get_pipeline(cfg.pipeline)
        self.input_topic = cfg.input_topic or self.pipeline.input_topic
        self.topics = Topics.for_input(
            self.input_topic, cfg.output_topic or self.pipeline.output_topic, cfg.dlq_topic, cfg.late_topic
        )
        self.output_topic = self.topics.output
        self.group_id = cfg.group_id or f"tidebatch-{cfg.pipeline}"
        self.model = self.pipeline.load_model()
        self.codec = self.pipeline.make_codec(cfg)
        b = cfg.batching
        policy_params = _policy_params(cfg, self.pipeline.max_batch_rows)
        self.policy = make_policy(b.policy, **policy_params)
        self.metrics = WorkerMetrics(cfg.pipeline, b.policy)
        rt = cfg.runtime
        self.session: InferenceSession | ProcessSession
        if rt.model_process:
            restarts = self.metrics.model_restarts.labels(cfg.pipeline)
            self.session = ProcessSession(
                self.model.onnx_path, rt.providers, rt.intra_op_threads, on_restart=restarts.inc
            )
        else:
            self.session = InferenceSession(self.model.onnx_path, rt.providers, rt.intra_op_threads)
        try:
            self._set_up(cfg, policy_params, sinks, hooks)
        except BaseException:
            # Nobody will call run() or its shutdown: a model process must not outlive
            # a worker that never started.
            self.session.close()
            raise

    def _set_up(
        self,
        cfg: WorkerConfig,
        policy_params: dict[str, Any],
        sinks: list[ResultSink] | None,
        hooks: list[WorkerHook] | None,
    ) -> None:
        """The rest of __init__, once the model's session exists."""
        b = cfg.batching
        rt = cfg.runtime
        self.executors = rt.executors or (4 if rt.model_process else 1)
        self.metrics.provider.info(
            {"model": self.model.name, "version": self.model.version, "provider": self.session.provider}
        )
        # Per-request metrics, bound once: labels() costs a lock and a dict lookup.
        self._queue_rows_gauge = self.metrics.queue_rows.labels(cfg.pipeline)
        self._queue_wait_hist = self.metrics.queue_wait.labels(cfg.pipeline)
        self._e2e_hist = self.metrics.e2e.labels(cfg.pipeline)
        self.cost = CostModel()
        if cfg.runtime.warmup:
            self._warm_up()
        batcher = Batcher(
            self.policy,
            self.cost,
            expiry_action=b.expiry_action,  # type: ignore[arg-type]
            late_share=b.late_share,
            max_late_rows=b.max_late_rows,
            allowed_batch_sizes=b.allowed_batch_sizes or None,
        )
        depth = None
        if rt.model_process and self.executors > 1:
            # Several batches in flight only while a backlog needs the model's full rate
            # (batching/depth.py): from the backpressure's low watermark (and at least a
            # full batch for every executor) queued, back to one at a time at one full
            # batch. A lower mark flipped JSON requests at 50 % load into backlog mode on
            # every bursty poll, and their latency rose by half.
            max_rows = policy_params.get("max_batch_rows", self.pipeline.max_batch_rows)
            enter = min(max(self.executors * max_rows, b.queue_low_rows), b.queue_high_rows)
            depth = PipelineDepth(self.executors, enter, min(max_rows, enter - 1))
        self.queue = BatchQueue(batcher, self.clock, b.queue_high_rows, b.queue_low_rows, depth=depth)
        self.backpressure = Backpressure(b.queue_high_rows, b.queue_low_rows, poll_records=_POLL_RECORDS)
        # Route already-expired records before decoding them (_expired_before_decoding):
        # only where the configured outcome of expiry is "routed late" anyway.
        self._max_budget_ms: float | None = None
        if self.policy.separates_late and b.expiry_action == "route_late":
            self._max_budget_ms = max([b.slo_ms, *b.priority_slo_ms.values()])
        self.tracker = OffsetTracker()
        self.sinks = list(sinks or [])
        self.hooks = list(hooks or [])
        self.stats = WorkerStats()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._fatal: str | None = None
        self._drain_deadline: float | None = None  # monotonic; set when shutdown starts
        self._executors: list[threading.Thread] = []
        self._finished: queue.Queue[_Done | None] = queue.Queue(maxsize=_PUBLISH_BACKLOG)
        self._publisher: threading.Thread | None = None
        self._unpin_to: set[int] | None = None  # the cores to give all threads back at shutdown
        self._restore_interpreter: Callable[[], None] | None = None
        self.producer = make_producer(cfg)
        # Until run() asks the broker for its topics' limits: the producer's own.
        self.outcomes = Outcomes(
            self.producer,
            lambda rec: self.tracker.ack(rec.tp, rec.offset),
            self.topics,
            self._limits({}),
            metrics=self.metrics,
            pipeline=cfg.pipeline,
            sinks=self.sinks,
            on_undeliverable=cfg.limits.on_undeliverable,
            count=self._count,
            fail=self.fail,
        )
        self.source = None  # created in run(): joining the group is the last step
        self.assigned: list[TopicPartition] = []
        self.started = threading.Event()  # model loaded, source subscribed
        self.last_poll_ok: float | None = None
        self._anchor: tuple[float, int] | None = None  # (batcher clock, wall ms), _clock_anchor

    # ------------------------------------------------------------------ start-up
    def _warm_up(self) -> None:
        """Profile the model on real sample requests to seed the cost model."""
        sizes = self.pipeline.warmup_sizes
        samples = self.pipeline.make_samples(12345)
        by_bucket: dict[object, list] = {}
        for i in range(max(sizes) * 4):
            key, value, headers = samples(i)
            d = self.codec.decode(value, dict(headers))
            by_bucket.setdefault(d.bucket, []).append(d)
        decoded = max(by_bucket.values(), key=len)  # requests of one bucket can share a batch
        sizes = tuple(n for n in sizes if n <= len(decoded)) or (1,)
        cost = self.session.profile(lambda n: self.codec.collate([d.payload for d in decoded[:n]]), sizes)
        # profile() fits against request counts; convert to rows with their mean size.
        mean_rows = sum(d.rows for d in decoded[: max(sizes)]) / max(sizes)
        cost.b /= mean_rows
        self.cost = CostModel(prior=cost)
        log.info(
            "warm-up profile of %s on %s: t(n) = %.3f ms + %.4f ms/row",
            self.model.name, self.session.provider, cost.a * 1e3, cost.b * 1e3,
        )

    def _limits(self, described: dict[str, int]) -> Limits:
        """The size limits (pipeline/limits.py) from the producer's own and the topics'
        max.message.bytes the broker described."""
        configured = self.cfg.limits.max_request_bytes or self.pipeline.max_request_bytes
        limits, warnings = resolve_limits(
            requested_request_bytes=configured,
            producer_bytes=self.producer.max_record_bytes,
            described=described,
            outgoing=self.topics.all(),
            dead_letter_topic=self.topics.dead_letter,
            prefix_bytes=self.cfg.limits.dead_letter_prefix_bytes,
        )
        for warning in warnings:
            log.warning("%s", warning)
        return limits

    def _read_topic_limits(self) -> None:
        from consumers.admin import topic_max_message_bytes

        described = topic_max_message_bytes(self.cfg.bootstrap_servers, self.topics.all())
        self.outcomes.limits = self._limits(described)
        log.info(
            "size limits: requests up to %d bytes; records to %s",
            self.outcomes.limits.request_bytes,
            ", ".join(f"{t} up to {self.outcomes.limits.for_topic(t)}" for t in self.topics.all()),
        )

    def _count(self, name: str, n: int) -> None:
        with self._stats_lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def stop(self, reason: str = "stop requested") -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
        self._stop.set()

    def fail(self, reason: str) -> None:
        """Stop with an error: the worker is no longer alive or ready, and run()
        returns 1 (the first reason is the one reported)."""
        if self._fatal is None:
            self._fatal = reason
        self.stop(reason)

    @property
    def stopping(self) -> bool:
        """stop() or fail() was called: the worker is shutting down."""
        return self._stop.is_set()

    @property
    def failure(self) -> str | None:
        """Why the worker failed, or None."""
        return self._fatal

    def threads(self) -> list[threading.Thread]:
        """The threads this worker needs while it runs: executors and the publisher."""
        return [*self._executors, *([self._publisher] if self._publisher is not None else [])]

    def _guarded(self, name: str, body: Callable[[], None]) -> Callable[[], None]:
        """A thread body whose death is the worker's: without its executors or its
        publisher, requests would queue for ever while the worker looked healthy."""

        def run() -> None:
            try:
                body()
            except BaseException as exc:  # noqa: BLE001 - reported, and the worker stops
                log.critical("%s thread died", name, exc_info=True)
                self.fail(f"{name} thread died: {type(exc).__name__}: {exc}")

        return run

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Consume until stop(); finish in-flight work, commit, return an exit code."""
        # Process-wide GIL and GC settings (runtime/interpreter.py), undone at shutdown.
        rt = self.cfg.runtime
        interval_s = interpreter.CALM_SWITCH_INTERVAL_S
        if rt.gil_switch_interval_ms is not None:
            interval_s = rt.gil_switch_interval_ms / 1000.0
        self._restore_interpreter = interpreter.apply(interval_s, rt.gc_gen0_threshold or None)
        allocator.fix_mmap_threshold()  # runtime/allocator.py: large values must not pile up
        # Unless configured, the interval follows the queue's mode (interpreter.py).
        self._interval_follows_depth = rt.gil_switch_interval_ms is None
        self._backlogged = False
        self._read_topic_limits()
        self.source = make_source(
            self.cfg, self.group_id, [self.input_topic], self._on_assign, self._on_revoke
        )
        self._publisher = threading.Thread(
            target=self._guarded("publisher", self._publisher_loop), name="publisher", daemon=True
        )
        self._publisher.start()
        self._start_executors()
        log.info(
            "worker %s consuming %s -> %s (group %s, protocol %s, instance %s, policy %s, provider %s)",
            self.cfg.pipeline, self.input_topic, self.output_topic, self.group_id,
            self.cfg.group_protocol, self.cfg.instance_id() or "dynamic",
            self.cfg.batching.policy, self.session.provider,
        )
        self.started.set()
        next_commit = time.monotonic()
        next_lag = time.monotonic()
        try:
            while not self._stop.is_set():
                intake = self._apply_backpressure()
                if self.queue.backlogged != self._backlogged:
                    self._follow_backlog()
                if intake.max_records:
                    records = self.source.poll_batch(intake.max_records, _POLL_TIMEOUT)
                    self.last_poll_ok = time.monotonic()
                    if records:
                        self._admit(records)
                    self.producer.poll(0)
                else:
                    # Holding: wait for the executors here, serving result acks meanwhile.
                    self.producer.poll(_HOLD_WAIT)
                    self.last_poll_ok = time.monotonic()
                self._route_late()
                for sink in self.sinks:
                    sink.poll()
                now = time.monotonic()
                if now >= next_commit:
                    # Asynchronous: a commit waiting on a failing-over broker would stop
                    # the loop (polls, delivery reports, late routing) for seconds.
                    self._commit(wait=False)
                    next_commit = now + self.cfg.commit_interval_ms / 1000.0
                if now >= next_lag:
                    self._queue_rows_gauge.set(self.queue.rows)  # also while no records arrive
                    self._update_lag()
                    next_lag = now + _LAG_INTERVAL
            return self._shutdown()
        except Exception as exc:
            log.exception("worker failed; offsets not committed past finished work")
            self.fail(f"source loop failed: {type(exc).__name__}: {exc}")
            return self._shutdown(commit=True)

    def _follow_backlog(self) -> None:
        """The queue's depth changed mode (batching/depth.py): say so, and switch the
        GIL interval with it unless one is configured (runtime/interpreter.py)."""
        self._backlogged = self.queue.backlogged
        depth = self.queue.depth
        assert depth is not None
        if self._backlogged:
            log.info("backlog of %d rows: up to %d batches in flight", self.queue.backpressure_rows, depth.max_in_flight)
        else:
            log.info("backlog worked off: one batch in flight")
        if self._interval_follows_depth:
            interpreter.set_switch_interval(self._backlogged)

    def _start_executors(self) -> None:
        rt = self.cfg.runtime
        model_process = isinstance(self.session, ProcessSession)
        # With a model process, the model is what needs a core of its own, not the executors.
        pinned = 1 if model_process else self.executors
        pinning = affinity.plan(pinned) if rt.pin_executors and rt.intra_op_threads == 1 else None
        if rt.pin_executors and pinning is None:
            log.warning(
                "runtime.pin_executors: needs Linux, runtime.intra_op_threads 1 and more allowed "
                "cores than executors; not pinning"
            )
        tids: list[int] = []
        for i in range(self.executors):
            ready = threading.Event()
            core = pinning[0][i] if pinning and not model_process else None
            body = self._guarded(f"executor-{i}", lambda core=core, ready=ready: self._executor_loop(core, tids, ready))
            t = threading.Thread(target=body, name=f"executor-{i}", daemon=True)
            t.start()
            ready.wait(10)
            self._executors.append(t)
        if not pinning:
            return
        # Undone at shutdown: a worker run inside another program (tests, the demo)
        # must not leave that program's threads on fewer cores.
        self._unpin_to = set(os.sched_getaffinity(0))
        if model_process:
            assert isinstance(self.session, ProcessSession)
            self.session.pin(pinning[0][0])
            moved = affinity.pin_other_threads([], pinning[1])
            log.info("model process pinned to core %s; %d worker threads on %s", pinning[0][0], moved, sorted(pinning[1]))
        else:
            moved = affinity.pin_other_threads(tids, pinning[1])
            log.info("executors pinned to cores %s; %d other threads on %s", pinning[0], moved, sorted(pinning[1]))

    def _shutdown(self, commit: bool = True) -> int:
        """Stop consuming, finish in-flight batches, flush sinks, commit, leave; all
        within cfg.drain_timeout_s (plus the final commit and the group leave). Work
        still queued when it runs out stays uncommitted, replayed by the next owner."""
        self._drain_deadline = time.monotonic() + self.cfg.drain_timeout_s
        self.queue.close()
        for t in self._executors:
            t.join(timeout=self._drain_left())
        if any(t.is_alive() for t in self._executors):
            log.warning("drain time (%.0f s) ran out: queued requests stay uncommitted", self.cfg.drain_timeout_s)
            self.queue.abandon()
        if self._publisher is not None:
            self._hand_over(None)
            self._publisher.join(timeout=self._drain_left())
        self.session.close()
        if self._restore_interpreter is not None:
            self._restore_interpreter()
            self._restore_interpreter = None
        if self._unpin_to is not None:
            affinity.pin_other_threads([], self._unpin_to)
            self._unpin_to = None
        self._route_late()
        remaining = self.producer.flush(max(self._drain_left(), 1.0))
        for sink in self.sinks:
            sink.flush()
        self.producer.flush(max(min(self._drain_left(), 5.0), 0.5))
        if commit:
            self._commit()
        if self.source is not None:
            self.source.close()
        for sink in self.sinks:
            sink.close()
        if remaining:
            log.error("%d records were not acknowledged by Kafka before shutdown", remaining)
        if self._fatal:
            log.error("worker stopped on error: %s", self._fatal)
            return 1
        log.info("worker stopped cleanly: %s", self.stats_line())
        return 0

    def _drain_left(self) -> float:
        if self._drain_deadline is None:
            return self.cfg.drain_timeout_s
        return max(self._drain_deadline - time.monotonic(), 0.0)

    def _hand_over(self, done: _Done | None) -> bool:
        """Give the publisher a finished batch (None: no more will come). Never blocks
        for ever: gives up once the publisher is dead or the drain time has run out
        (that batch's requests then stay uncommitted and are replayed)."""
        while True:
            try:
                self._finished.put(done, timeout=_HANDOFF_WAIT)
                return True
            except queue.Full:
                publisher = self._publisher
                if publisher is None or not publisher.is_alive():
                    return False
                if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline:
                    return False

    # ------------------------------------------------------------------ source side
    def _admit(self, records: list[SourceRecord]) -> None:
        now = self.clock.now()
        now_wall = wall_ms()
        anchor_now, anchor_wall = self._clock_anchor(now, now_wall)
        requests: list[Request] = []
        notify(self.sinks, "track", records)  # offset-ordered sinks (Parquet) must see every offset
        self.tracker.track_many([(rec.tp, rec.offset) for rec in records])
        consumed = len(records)
        records = self._within_size_limit(records)
        records = self._expired_before_decoding(records, now_wall)
        outcomes = decode_all(self.codec, [(rec.value, rec.headers) for rec in records])
        for rec, decoded in zip(records, outcomes, strict=True):
            if isinstance(decoded, Exception):
                _drop_traceback(decoded)
            if isinstance(decoded, DecodeError):
                self._dead_letter(rec, str(decoded), "decode")
                continue
            if isinstance(decoded, Exception):  # a codec bug must not kill the worker
                self._dead_letter(rec, f"decoder crashed: {type(decoded).__name__}: {decoded}", "decode")
                continue
            budget_ms = self.cfg.slo_seconds(decoded.priority) * 1000.0
            if decoded.deadline_ms is not None:
                budget_ms = min(budget_ms, float(decoded.deadline_ms))  # may only tighten
            ts = rec.timestamp_ms if rec.timestamp_ms is not None else now_wall
            deadline_wall = ts + budget_ms
            requests.append(
                Request(
                    rows=decoded.rows,
                    arrival=now,
                    deadline=anchor_now + (deadline_wall - anchor_wall) / 1000.0,
                    priority=decoded.priority,
                    bucket=decoded.bucket,
                    item=InFlight(rec, decoded, deadline_wall, now_wall),
                )
            )
        with self._stats_lock:
            self.stats.consumed += consumed
        if requests:
            self.queue.put_many(requests)
        self._queue_rows_gauge.set(self.queue.rows)

    def _clock_anchor(self, now: float, now_wall: int) -> tuple[float, int]:
        """The (batcher clock, wall ms) pair through which Kafka timestamps become
        deadlines. Kept fixed rather than re-read every poll: wall_ms() is whole
        milliseconds, so a fresh pair per poll moved the mapping by up to 1 ms from
        poll to poll, and two requests with the same timestamp polled apart could swap
        places under EDF. Fixed, equal timestamps give equal deadlines (FIFO tie-break)
        and later timestamps later deadlines, so EDF keeps the order of one camera's
        frames (docs/ARCHITECTURE.md). Re-anchored only on a wall-clock step."""
        anchor = self._anchor
        if anchor is None or abs((now - anchor[0]) - (now_wall - anchor[1]) / 1000.0) > _ANCHOR_DRIFT_S:
            anchor = self._anchor = (now, now_wall)
        return anchor

    def _within_size_limit(self, records: list[SourceRecord]) -> list[SourceRecord]:
        """Dead-letter requests over the entry limit before anything else looks at
        them (pipeline/limits.py): decoding a huge value costs memory and time, and its
        copy must still fit the dead-letter topic."""
        limit = self.outcomes.limits.request_bytes
        kept: list[SourceRecord] = []
        for rec in records:
            size = record_bytes(rec.key, rec.value, list(rec.headers.items()))
            if size <= limit:
                kept.append(rec)
            else:
                self._dead_letter(rec, f"request is {size} bytes, over the {limit}-byte limit (limits.max_request_bytes)", "admit")
        return kept

    def _dead_letter(self, rec: SourceRecord, reason: str, stage: str) -> None:
        self.outcomes.dead_letter(rec, reason, stage)

    def _dead_letter_internal(self, requests: list[Request], exc: Exception, stage: str) -> None:
        """A bug of ours, not bad input: the requests still get an outcome (the DLQ,
        with the error), so none is lost and the worker keeps going."""
        reason = f"internal error: {type(exc).__name__}: {exc}"
        for req in requests:
            inf: InFlight = req.item
            self._dead_letter(inf.rec, reason, stage)

    def _route_late(self) -> None:
        routed = self.queue.pop_routed_late()
        if routed:
            self.outcomes.late([(req.item.rec, req.item.deadline_wall_ms) for req in routed], wall_ms())

    def _expired_before_decoding(self, records: list[SourceRecord], now_wall: int) -> list[SourceRecord]:
        """With route_late, route records that have expired whatever they contain, and
        return the others. A request's own deadline_ms can only tighten the budget of its
        priority, so Kafka timestamp + the largest budget already past means no outcome
        but "late" is possible. Decoding is the worker's most expensive step (the model
        runs on the other core): under a backlog, decoding answers nobody waits for any
        more would starve the fresh requests behind them."""
        if self._max_budget_ms is None:
            return records
        horizon = now_wall - self._max_budget_ms
        expired = [r for r in records if r.timestamp_ms is not None and r.timestamp_ms < horizon]
        if not expired:
            return records
        self.outcomes.late([(r, r.timestamp_ms + self._max_budget_ms) for r in expired], now_wall)
        gone = {id(r) for r in expired}
        return [r for r in records if id(r) not in gone]

    def _apply_backpressure(self) -> IntakeDecision:
        """Hold or pause consumption by the queue's in-time rows (batching/backpressure.py
        says why holding, not pausing, is the usual answer)."""
        before = self.backpressure.state
        intake = self.backpressure.step(self.queue.backpressure_rows, time.monotonic())
        if intake.started_hold:
            self.metrics.pauses.labels(self.cfg.pipeline).inc()
            with self._stats_lock:
                self.stats.pauses += 1
        if intake.state is not before:
            self.metrics.paused.labels(self.cfg.pipeline).set(0 if intake.state is Intake.OPEN else 1)
        if self.source is not None:
            if intake.state is Intake.PAUSED and not self.source.paused:
                log.warning(
                    "queue at %d rows and not draining: pausing the partitions",
                    self.queue.backpressure_rows,
                )
                self.source.pause_all()
            elif intake.state is not Intake.PAUSED and self.source.paused:
                self.source.resume_all()
        return intake

    def _commit(self, only: list[TopicPartition] | None = None, *, wait: bool = True) -> None:
        """Commit the done watermarks (of `only`'s partitions). wait=False: the result
        comes later, in a poll; revoke and shutdown wait, as the partitions or the
        group are let go right after. An older asynchronous commit that lands after
        a newer one only moves a watermark back: a replay, never a loss."""
        if self.source is None:
            return
        offsets = self.tracker.committable()
        if only is not None:
            wanted = set(only)
            offsets = {tp: o for tp, o in offsets.items() if tp in wanted}
        if not offsets:
            return
        if not wait:
            self.source.commit(offsets, on_done=lambda err: self._committed(err, offsets))
            return
        try:
            self.source.commit(offsets)
        except Exception as exc:
            self._committed(exc, offsets)
        else:
            self._committed(None, offsets)

    def _committed(self, err: Exception | None, offsets: dict[TopicPartition, int]) -> None:
        if err is None:
            self.tracker.committed(offsets)
            self.metrics.commits.labels(self.cfg.pipeline, "ok").inc()
            with self._stats_lock:
                self.stats.commits += 1
        else:  # not marked committed: offered again at the next interval (tracker.committable)
            self.metrics.commits.labels(self.cfg.pipeline, "error").inc()
            log.warning("offset commit failed: %s", err)

    def _update_lag(self) -> None:
        if self.source is None:
            return
        try:
            # Only a paused source asks the broker (its cached watermark is frozen): that
            # query blocks this thread for a round trip per partition, and a hold is
            # short and frequent under load (asking then cost seconds-long stalls, p99).
            for (topic, partition), lag in self.source.lag().items():
                self.metrics.lag.labels(topic, str(partition)).set(lag)
        except Exception as exc:
            log.debug("lag update failed: %s", exc)

    # Rebalance callbacks run in the source thread, inside poll_batch().
    def _on_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = sorted(set(self.assigned) | set(tps))
        self.metrics.assigned.labels(self.cfg.pipeline).set(len(self.assigned))
        log.info("assigned %s", tps)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        """Finish the in-flight work of revoked partitions, commit it, let go. Never
        commit past work that was not done: what is still pending after the wait is
        replayed by the partition's next owner."""
        if not tps:
            return
        notify(self.sinks, "revoke", tps)  # sinks finish these partitions' files once drained
        deadline = time.monotonic() + _REVOKE_WAIT
        while any(self.tracker.pending(tp) for tp in tps) and time.monotonic() < deadline:
            self._route_late()
            self.producer.poll(0.01)
            for sink in self.sinks:
                sink.poll()
        if any(self.tracker.pending(tp) for tp in tps):
            for sink in self.sinks:
                sink.flush()
            self.producer.flush(2.0)
        self._commit(only=tps)
        self.tracker.forget(tps)
        self.assigned = sorted(set(self.assigned) - set(tps))
        self.metrics.assigned.labels(self.cfg.pipeline).set(len(self.assigned))
        for topic, partition in tps:
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(topic, str(partition))
        log.info("revoked %s", tps)

    # ------------------------------------------------------------------ executor side
    def _executor_loop(
        self, core: set[int] | None = None, tids: list[int] | None = None, ready: threading.Event | None = None
    ) -> None:
        if core is not None:
            affinity.pin_current_thread(core)
        if tids is not None:
            tids.append(threading.get_native_id())
        if ready is not None:
            ready.set()
        while True:
            batch = self.queue.get_batch()
            if batch is None:
                return
            parts: list[_Finished] = []
            try:
                self._run_batch(batch, parts)
            except Exception as exc:  # never lose a batch to a bug: dead-letter it
                log.exception("batch failed")
                covered = {id(req) for part in parts for req in part.batch.requests}
                self._dead_letter_internal([r for r in batch.requests if id(r) not in covered], exc, "inference")
            # Exactly once per dispatched batch, even empty: the publisher waits for
            # every sequence number in turn. False: no publisher to take it any more.
            if not self._hand_over(_Done(batch.seq, parts)):
                return

    def _infer(self, batch: Batch) -> tuple[list[dict] | None, float]:
        decoded = [r.item.decoded for r in batch.requests]
        for hook in self.hooks:
            hook.before_inference(decoded)
        feeds = self.codec.collate([d.payload for d in decoded], batch.pad_to_rows)
        # The model's own time: with a model process, not the wait behind another batch.
        outputs, seconds = self.session.run_timed(feeds)
        return self.codec.split(outputs, decoded), seconds

    def _run_batch(self, batch: Batch, parts: list[_Finished]) -> None:
        started_wall = wall_ms()
        try:
            results, seconds = self._infer(batch)
        except Exception as exc:
            self.queue.done(batch, 0.0)
            self._isolate_failure(batch, exc, parts)
            return
        self.queue.done(batch, seconds)
        parts.append(_Finished(batch, results, batch.rows, seconds, started_wall))

    def _publisher_loop(self) -> None:
        """Publish finished batches in dispatch order. With several batches in flight
        an executor can hand its batch over before one dispatched earlier (the model
        process answers in order, the executors then race for the GIL), and results
        of one key, e.g. one camera's frames, must come out in the order they went in
        (pipeline/reorder.py)."""
        in_order: Reorder[list[_Finished]] = Reorder()
        while True:
            done = self._finished.get()
            if done is None:
                break
            for parts in in_order.add(done.seq, done.parts):
                for part in parts:
                    self._publish_part(part)
        for parts in in_order.rest():  # a lost number (a dead executor): publish the rest
            for part in parts:
                self._publish_part(part)

    def _publish_part(self, done: _Finished) -> None:
        """Publish one finished part. Every request gets exactly one outcome, whatever
        fails: _publish gives each its own, and a bug before it gave any (a hook, the
        result documents) dead-letters them all with the error."""
        try:
            self._publish(done.batch.requests, done.results, done.batch_rows, done.seconds, done.started_wall)
        except _BeforeOutcomes as exc:
            log.error("publishing a batch failed", exc_info=exc.__cause__)
            self._dead_letter_internal(done.batch.requests, exc.error, "publish")
            return
        if done.is_batch:
            self._count_batch(done.batch, done.seconds)

    def _count_batch(self, batch: Batch, seconds: float) -> None:
        pipeline = self.cfg.pipeline
        self.metrics.batches.labels(pipeline, self.cfg.batching.policy, batch.reason).inc()
        self.metrics.batch_rows.labels(pipeline, self.cfg.batching.policy).observe(batch.rows)
        self.metrics.inference.labels(pipeline).observe(seconds)
        with self._stats_lock:
            self.stats.batches += 1
            self.stats.batch_rows += batch.rows

    def _isolate_failure(self, batch: Batch, exc: Exception, parts: list[_Finished]) -> None:
        """A batch the model refused: run its requests one by one so that a single
        poison request goes to the DLQ and the others are still scored."""
        log.warning("batch of %d requests failed (%s); retrying one by one", len(batch.requests), exc)
        for req in batch.requests:
            single = Batch([req], req.rows, batch.bucket, batch.reason, batch.formed_at, batch.late)
            started_wall = wall_ms()
            try:
                results, seconds = self._infer(single)
            except Exception as one_exc:
                inf: InFlight = req.item
                reason = f"model rejected the request: {type(one_exc).__name__}: {one_exc}"
                self._dead_letter(inf.rec, reason.splitlines()[0], "inference")
                continue
            parts.append(_Finished(single, results, req.rows, seconds, started_wall, is_batch=False))

    def _publish(
        self,
        requests: list[Request],
        results: list[dict] | None,
        batch_rows: int,
        seconds: float,
        started_wall: int,
    ) -> None:
        """One outcome per request: its result, or its dead letter when the result
        cannot be serialised or is over the output topic's limit (decided here, before
        anything is sent, so that one request's result never touches its batch-mates').
        Raises _BeforeOutcomes if it failed before any request had its outcome."""
        infs: list[InFlight] = [req.item for req in requests]
        done_wall = wall_ms()
        try:
            assert results is not None and len(results) == len(requests)
            docs = [
                self._result_doc(inf, result, batch_rows, seconds, started_wall, done_wall)
                for inf, result in zip(infs, results, strict=True)
            ]
            keep = [True] * len(docs)
            for hook in self.hooks:
                verdicts = hook.after_inference([inf.rec for inf in infs], docs)
                keep = [k and v for k, v in zip(keep, verdicts, strict=True)]
        except Exception as exc:
            raise _BeforeOutcomes(exc) from exc
        counts = {"ok": 0, "late": 0, "duplicate": 0}
        rows: list[ScoredRow] = []
        queue_waits: list[float] = []
        e2e: list[float] = []
        for inf, doc, publish in zip(infs, docs, keep, strict=True):
            rec = inf.rec
            if not publish:
                # Dropped replay: its first outcome was already published.
                counts["duplicate"] += 1
                notify(self.sinks, "skip", [rec])
                self.tracker.ack(rec.tp, rec.offset)
                continue
            refused = self._unpublishable(rec, doc)
            if isinstance(refused, str):
                self._dead_letter(rec, refused, "publish")
                continue
            # Exactly one outcome per record: a replay is a duplicate, whatever its timing.
            counts["duplicate" if doc.get("duplicate") else "late" if doc["late"] else "ok"] += 1
            if self.sinks:
                self.tracker.add_acks(rec.tp, rec.offset, len(self.sinks))
                rows.append(ScoredRow(rec, inf.decoded, doc, lambda rec=rec: self.tracker.ack(rec.tp, rec.offset)))
            self.outcomes.result(rec, refused)
            queue_waits.append(max(started_wall - inf.consumed_wall_ms, 0) / 1000.0)
            if rec.timestamp_ms is not None:
                e2e.append(max(done_wall - rec.timestamp_ms, 0) / 1000.0)
        observe_many(self._queue_wait_hist, queue_waits)
        observe_many(self._e2e_hist, e2e)
        if rows:
            try:
                for sink in self.sinks:
                    sink.write(rows)
            except Exception as exc:
                # The results are out; the rows' acks will never come, so their offsets
                # stay uncommitted and a restart replays them into the sink.
                log.exception("a sink failed")
                self.fail(f"sink failed: {type(exc).__name__}: {exc}")
        topic = infs[0].rec.topic
        for outcome, n in counts.items():
            if n:
                self.metrics.outcome(topic, outcome, n)
        if counts["late"]:
            self.metrics.slo_misses.labels(self.cfg.pipeline).inc(counts["late"])
        with self._stats_lock:
            self.stats.scored += counts["ok"] + counts["late"]
            self.stats.scored_late += counts["late"]
            self.stats.duplicates += counts["duplicate"]

    def _unpublishable(self, rec: SourceRecord, doc: dict) -> bytes | str:
        """The result record's value, or why this result cannot be published."""
        try:
            value = orjson.dumps(doc)
        except (TypeError, orjson.JSONEncodeError) as exc:
            return f"result cannot be serialised: {exc}"
        return self.outcomes.result_too_large(rec, value) or value

    def _result_doc(
        self, inf: InFlight, result: dict, batch_rows: int, seconds: float, started_wall: int, done_wall: int
    ) -> dict:
        rec = inf.rec
        doc = {
            # Every result carries its request id (replays are deduplicated by it),
            # also from codecs whose own fields do not include it (camera: camera_id/frame_id).
            "request_id": inf.decoded.request_id,
            **result,
            "key": rec.key.decode("utf-8", "replace") if rec.key is not None else None,
            "model": self.model.name,
            "model_version": self.model.version,
            "batch_rows": batch_rows,
            "queue_wait_ms": max(started_wall - inf.consumed_wall_ms, 0),
            "inference_ms": round(seconds * 1000.0, 3),
            "kafka_ts_ms": rec.timestamp_ms,
            "scored_at_ms": done_wall,
            "priority": inf.decoded.priority,
            "late": done_wall > inf.deadline_wall_ms,
            "source": {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset},
        }
        if inf.decoded.tenant is not None:
            doc["tenant"] = inf.decoded.tenant
        return doc

    # ------------------------------------------------------------------ reporting
    def stats_line(self) -> str:
        s = self.stats
        mean = s.batch_rows / s.batches if s.batches else 0.0
        return (
            f"consumed={s.consumed} scored={s.scored} late={s.scored_late} "
            f"routed_late={s.routed_late} dlq={s.dlq} batches={s.batches} "
            f"mean_batch_rows={mean:.1f} commits={s.commits} pauses={s.pauses}"
        )


def _drop_traceback(exc: BaseException) -> None:
    """Forget where a refused request's exception was raised. Its traceback holds the
    decoding frames, whose locals hold the request's value, and decode_all's frame,
    which holds the list of outcomes that holds the exception: a reference cycle that
    only the cyclic collector frees, and the worker runs it rarely (runtime/
    interpreter.py). Refused 10 MB camera frames grew the heap by gigabytes that way."""
    current: BaseException | None = exc
    while current is not None:
        following = current.__cause__ or current.__context__
        current.__traceback__ = current.__context__ = current.__cause__ = None
        current = following


def _policy_params(cfg: WorkerConfig, pipeline_max_rows: int) -> dict:
    b = cfg.batching
    params: dict[str, Any] = {"max_batch_rows": b.max_batch_rows or pipeline_max_rows}
    if b.policy == "static":
        params["max_queue_delay"] = b.max_queue_delay_ms / 1000.0
    elif b.policy == "adaptive":
        params["hold_for_efficiency"] = b.hold_for_efficiency
    elif b.policy == "none":
        params = {}
    return params


def install_signal_handlers(worker: Worker, on_signal: Callable[[], None] | None = None) -> None:
    """SIGTERM/SIGINT: stop consuming, finish in-flight batches, commit, exit 0."""
    import signal

    def handler(signum: int, _frame: object) -> None:
        worker.stop(f"signal {signal.Signals(signum).name}")
        if on_signal:
            on_signal()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
