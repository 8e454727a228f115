"""The worker's run loop: a consumer-group member that admits requests, has them
batched, scored and published, and commits what is done. Its rooms (pipeline/worker/):

- the source thread (the caller of run(), this module) polls Kafka, admits records
  (admission.py: size limit, expiry, decode, deadlines), queues requests, serves
  producer delivery reports, applies backpressure, commits offsets and handles
  rebalances. It never waits for a result: many requests are in flight at once, or
  no batch could ever form.
- executor threads (executors.py) take batches from the BatchQueue and score them
  (pipeline/scoring.py);
- the publisher thread (publisher.py) builds the result documents, produces them and
  hands the rows to the sinks, in dispatch order;
- outcomes (pipeline/delivery/outcomes.py) send results, dead letters and late records with
  retries, and ack each offset when its outcome is durable.

Delivery: at-least-once by default. Each consumed offset is tracked; it is done when
every sink has acknowledged its outcome; each partition commits its contiguous done
watermark. With delivery exactly_once the outcome records and the offsets go into one
Kafka transaction instead (transactions.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from consumers.records import KafkaRefused, Source, SourceRecord, TopicPartition
from models.registry import ModelSpec
from pipeline.batching.backpressure import IntakeDecision
from pipeline.batching.request import Request
from pipeline.clock import wall_ms
from pipeline.config import WorkerConfig
from pipeline.delivery.intake import follow_intake
from pipeline.delivery.outage_log import Acks, OutageLog
from pipeline.delivery.outcomes import Outcomes
from pipeline.delivery.partitions import Partitions
from pipeline.runtime import allocator, interpreter
from pipeline.runtime.model_process import ProcessSession
from pipeline.runtime.session import InferenceSession
from pipeline.scoring import ScoringStep
from pipeline.sinks import notify
from pipeline.worker.admission import Admission
from pipeline.worker.executors import Executors
from pipeline.worker.late_routing import outcome_server
from pipeline.worker.parts import WorkerParts
from pipeline.worker.publisher import Publisher

log = logging.getLogger(__name__)

_POLL_TIMEOUT = 0.02
_HOLD_WAIT = 0.005  # s; how long a holding source loop waits for acks per turn
_LAG_INTERVAL = 1.0


class Worker:
    """One consumer-group member of a pipeline; run() until stop().

    cfg: the whole configuration (pipeline/config/sections.py).
    parts: what it is built from (pipeline/worker/parts.py): the batcher's clock, the
    offline sinks for the result rows (flushed before commits), the hooks that see each
    batch before and after the model (pipeline/hooks.py), ...

    Read by pipeline/ops/health.py and the tests: started, assigned, last_poll_ok, stopping,
    failure, threads(), stats, session.provider, tracker, queue, redis, kafka_progress,
    calls.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        *,
        parts: WorkerParts,
    ) -> None:
        """parts: built by the composition root, pipeline/app/compose.py (build_parts,
        or build_worker for both at once)."""
        self.cfg = cfg
        self.clock = parts.queue.clock
        self.pipeline = parts.pipeline
        self.topics = parts.topics
        self.input_topic = parts.input_topic
        self.output_topic = parts.topics.output
        self.group_id = parts.group_id
        self.policy = parts.policy
        self.metrics = parts.metrics
        self.slot, self.versions = parts.slot, parts.versions  # the serving model version, and later ones
        self.queue = parts.queue
        self.backpressure = parts.backpressure
        self.executors = parts.executors
        self.producer = parts.producer
        self.sinks = parts.sinks
        self.redis, self.tracer = parts.redis, parts.tracer  # closed by whoever built the parts, not here
        self.credentials = parts.credentials
        # What the rooms share (pipeline/delivery/), made before any of them.
        self.lifecycle = parts.lifecycle
        self.tracker, self.stats = parts.tracker, parts.stats
        self.kafka_progress = parts.progress  # whether results and commits get through (pipeline/ops/health.py)
        self.calls = parts.calls  # the blocking client call the source thread is in (/healthz, the watchdog)
        self.transactions = parts.transactions
        self._describe_limits, self._open_source = parts.describe_limits, parts.open_source
        try:
            self._wire_rooms(cfg, parts)
        except BaseException:
            # Nobody will call run() or its shutdown: a model process must not outlive
            # a worker that never started.
            self.slot.close()
            raise

    @property
    def step(self) -> ScoringStep:
        """The serving model version's scoring step (it changes on a hot swap)."""
        return self.slot.current

    @property
    def session(self) -> InferenceSession | ProcessSession:
        return self.slot.current.session

    @property
    def model(self) -> ModelSpec:
        return self.slot.current.model

    def _wire_rooms(self, cfg: WorkerConfig, parts: WorkerParts) -> None:
        """Each room gets what it needs passed in: parts, the shared lifecycle, and the
        rooms built before it."""
        self._queue_rows_gauge = self.metrics.queue_rows.labels(cfg.pipeline)
        self._restore_interpreter: Callable[[], None] | None = None
        self.outage_log = OutageLog(self.kafka_progress, self.metrics, cfg.pipeline, self.calls)
        self.report_outage = self.outage_log.report  # the watchdog's tick
        self._acks = Acks(self.tracker)
        self.outcomes = Outcomes(
            self.producer,
            self._acks,
            self.topics,
            parts.limits,
            metrics=self.metrics,
            pipeline=cfg.pipeline,
            sinks=self.sinks,
            on_undeliverable=cfg.limits.on_undeliverable,
            count=self.stats.count,
            fail=self.lifecycle.fail,
            transactions=self.transactions,
            carry_headers=cfg.result_headers, origin=parts.origin,
        )
        self.admission = Admission.from_rules(self.step.codec, parts.admission, self.outcomes, parts.limits.request_bytes)
        self.publisher = Publisher(
            self.step.hooks, self.outcomes, self.tracker, self.sinks, self.metrics, cfg.pipeline, cfg.batching.policy,
            self.stats, self.lifecycle, self.lifecycle.fail, self.tracer, self.admission.observe_answers,
            getattr(self.step.codec, "encode_result", None),  # a schema-registry codec's records, else JSON
        )
        self._executor_pool = Executors(self.queue, self.slot, self.publisher.hand_over, self.outcomes.dead_letter)
        self._serve_outcomes = outcome_server(self.queue, self.outcomes, self.metrics.tenants, self.transactions)
        self.partitions = Partitions(
            self.tracker, self.lifecycle, self.producer, self.sinks, self.metrics, cfg.pipeline,
            self.stats, self._serve_outcomes, self.transactions, self.kafka_progress,
        )
        self.started = threading.Event()  # model loaded, source subscribed
        self.last_poll_ok: float | None = None

    @property
    def source(self) -> Source | None:
        """The Kafka source, once run() has joined the group."""
        return self.lifecycle.source

    def stop(self, reason: str = "stop requested") -> None:
        self.lifecycle.stop(reason)

    def fail(self, reason: str) -> None:
        """Stop with an error: the worker is no longer alive or ready, and run()
        returns 1 (the first reason is the one reported)."""
        self.lifecycle.fail(reason)

    @property
    def stopping(self) -> bool:
        """stop() or fail() was called: the worker is shutting down."""
        return self.lifecycle.stopping

    @property
    def failure(self) -> str | None:
        """Why the worker failed, or None."""
        return self.lifecycle.failure

    def threads(self) -> list[threading.Thread]:
        """The threads this worker needs while it runs: executors and the publisher."""
        publisher = self.publisher.thread
        return [*self._executor_pool.threads, *([publisher] if publisher is not None else [])]

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
        limits = self._describe_limits()
        self.outcomes.limits, self.admission.request_bytes = limits, limits.request_bytes
        if self.transactions is not None:
            self.transactions.start()  # before joining the group: fences our predecessor
        source = self.lifecycle.source = self._open_source(
            self.partitions.on_assign, self.partitions.on_revoke, self.outage_log.broker_stats)
        self.publisher.start(self._guarded)
        self._executor_pool.start(
            self.executors, self._guarded, pin=rt.pin_executors, intra_op_threads=rt.intra_op_threads
        )
        log.info(
            "worker %s consuming %s -> %s (group %s, protocol %s, instance %s, policy %s, provider %s)",
            self.cfg.pipeline, self.input_topic, self.output_topic, self.group_id,
            self.cfg.group_protocol, self.cfg.instance_id() or "dynamic",
            self.cfg.batching.policy, self.session.provider,
        )
        self.versions.start()
        self.started.set()
        next_commit = time.monotonic()
        next_lag = time.monotonic()
        try:
            while not self.lifecycle.stopping:
                intake = self._apply_backpressure()
                if self.queue.backlogged != self._backlogged:
                    self._follow_backlog()
                if intake.max_records:
                    records = source.poll_batch(intake.max_records, _POLL_TIMEOUT)
                    self.last_poll_ok = time.monotonic()
                    if records:
                        self._admit(records)
                    self.producer.poll(0)
                else:
                    # Holding: wait for the executors here, serving result acks meanwhile.
                    self.producer.poll(_HOLD_WAIT)
                    self.last_poll_ok = time.monotonic()
                if self.credentials is not None:  # a refused login: new password, or the one line
                    self.credentials.check()
                if self.admission.waiting:  # records whose decode waited for a fetch (waiting.py)
                    self._queue_up(self.admission.admit_waiting(self.clock.now(), wall_ms()))
                self._serve_outcomes()
                self.outcomes.observe_stages()
                for sink in self.sinks:
                    sink.poll()
                now = time.monotonic()
                if self.transactions is not None:
                    if self.transactions.due(now):
                        self.partitions.commit(wait=False)
                elif now >= next_commit:
                    # Asynchronous: a commit waiting on a failing-over broker would stop
                    # the loop (polls, delivery reports, late routing) for seconds.
                    self.partitions.commit(wait=False)
                    next_commit = now + self.cfg.commit_interval_ms / 1000.0
                if now >= next_lag:
                    self._queue_rows_gauge.set(self.queue.rows)  # also while no records arrive
                    self.partitions.update_lag()
                    self.outage_log.sample(now, len(self.producer), len(self.tracker.committable()), self._acks.count)
                    next_lag = now + _LAG_INTERVAL
            return self._shutdown()
        except Exception as exc:  # a missing ACL or a refused login (KafkaRefused) is its one line, not a traceback
            log.error("worker failed; offsets not committed past finished work", exc_info=not isinstance(exc, KafkaRefused))
            self.fail(str(exc) if isinstance(exc, KafkaRefused) else f"source loop failed: {type(exc).__name__}: {exc}")
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

    def _shutdown(self, commit: bool = True) -> int:
        """Stop consuming, finish in-flight batches, flush sinks, commit, leave; all
        within cfg.drain_timeout_s (plus the final commit and the group leave). Work
        still queued when it runs out stays uncommitted, replayed by the next owner."""
        self.lifecycle.drain(self.cfg.drain_timeout_s)
        self.versions.stop()
        self.queue.close()
        if not self._executor_pool.join(self._drain_left):
            log.warning("drain time (%.0f s) ran out: queued requests stay uncommitted", self.cfg.drain_timeout_s)
            self.queue.abandon()
        if self.publisher.thread is not None:
            self.publisher.hand_over(None)
            self.publisher.thread.join(timeout=self._drain_left())
        self.slot.close()
        if self._restore_interpreter is not None:
            self._restore_interpreter()
            self._restore_interpreter = None
        self._executor_pool.unpin()
        self._serve_outcomes()
        remaining = self.producer.flush(max(self._drain_left(), 1.0))
        for sink in self.sinks:
            sink.flush()
        self.producer.flush(max(min(self._drain_left(), 5.0), 0.5))
        self.outcomes.observe_stages()
        if commit:
            self.partitions.commit()
        if self.lifecycle.source is not None:
            self.lifecycle.source.close()
        for sink in self.sinks:
            sink.close()
        if remaining:
            log.error("%d records were not acknowledged by Kafka before shutdown", remaining)
        if self.lifecycle.failure:
            log.error("worker stopped on error: %s", self.lifecycle.failure)
            return 1
        log.info("worker stopped cleanly: %s", self.stats_line())
        return 0

    def _drain_left(self) -> float:
        return self.lifecycle.drain_left(self.cfg.drain_timeout_s)

    # ------------------------------------------------------------------ source side
    def _admit(self, records: list[SourceRecord]) -> None:
        notify(self.sinks, "track", records)  # offset-ordered sinks (Parquet) must see every offset
        self.tracker.track_many([(rec.tp, rec.offset) for rec in records])
        if self.transactions is not None:
            self.transactions.track(records)
        requests = self.admission.admit(records, self.clock.now(), wall_ms())
        self.stats.count("consumed", len(records))
        self._queue_up(requests)

    def _queue_up(self, requests: list[Request]) -> None:
        if requests:
            self.queue.put_many(requests)
        self._queue_rows_gauge.set(self.queue.rows)

    def _apply_backpressure(self) -> IntakeDecision:
        """Hold or pause consumption by the queue's backpressure rows (batching/backpressure.py
        says why holding, not pausing, is the usual answer)."""
        return follow_intake(self.backpressure, self.queue.backpressure_rows, time.monotonic(), self.lifecycle.source,
                             self.metrics, self.cfg.pipeline, self.stats, "queue at %d rows")

    @property
    def assigned(self) -> list[TopicPartition]:
        """The partitions this worker owns now."""
        return self.lifecycle.assigned

    # ------------------------------------------------------------------ reporting
    def stats_line(self) -> str:
        return self.stats.line()
