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

from consumers.dead_letter import Origin, class_path, member_id
from consumers.offsets import OffsetTracker
from consumers.records import KafkaRefused, Source, SourceRecord, TopicPartition
from models.registry import ModelSpec
from pipeline.batching.backpressure import IntakeDecision
from pipeline.clock import wall_ms
from pipeline.config import WorkerConfig
from pipeline.config.tenants import max_budget_ms, tenant_budget_ms
from pipeline.delivery.intake import follow_intake
from pipeline.delivery.kafka_progress import KafkaProgress
from pipeline.delivery.outage_log import OutageLog
from pipeline.delivery.outcomes import Outcomes
from pipeline.delivery.partitions import Partitions
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.topic_limits import described_limits, worker_limits
from pipeline.delivery.transactions import Transactions
from pipeline.delivery.watchdog import CallWatch
from pipeline.kafka_backend import make_source
from pipeline.runtime import allocator, interpreter
from pipeline.runtime.model_process import ProcessSession
from pipeline.runtime.session import InferenceSession
from pipeline.scoring import ScoringStep
from pipeline.sinks import notify
from pipeline.worker.admission import Admission
from pipeline.worker.executors import Executors
from pipeline.worker.late_routing import route_late
from pipeline.worker.parts import WorkerParts
from pipeline.worker.publisher import Publisher
from pipeline.worker.tenant_standing import gate_standing

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
        try:
            self._build_rooms(cfg)
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

    def _build_rooms(self, cfg: WorkerConfig) -> None:
        b = cfg.batching
        self._queue_rows_gauge = self.metrics.queue_rows.labels(cfg.pipeline)
        self.tracker = OffsetTracker()
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._fatal: str | None = None
        self._drain_deadline: float | None = None  # monotonic; set when shutdown starts
        self._restore_interpreter: Callable[[], None] | None = None
        # Whether results and commits get through (read by pipeline/ops/health.py).
        self.kafka_progress = KafkaProgress(time.monotonic(), cfg.outage_after_s)
        # The blocking client call the source thread is in (read by /healthz and the watchdog).
        self.calls = CallWatch()
        self.outage_log = OutageLog(self.kafka_progress, self.metrics, cfg.pipeline, self.calls)
        self._acks = 0  # outcome records acknowledged so far
        self.report_outage = self.outage_log.report  # the watchdog's tick
        self.transactions = None if cfg.delivery != "exactly_once" else Transactions(  # make_producer made it transactional
            self.producer, lambda: self.source, self.tracker, self.sinks,  # type: ignore[arg-type, return-value]
            cfg.transaction_interval_ms / 1000.0, self.metrics, cfg.pipeline, self.stats, self.fail,
            owned=lambda: self.partitions.assigned, progress=self.kafka_progress, stopping=self._stop.is_set,
            calls=self.calls,
        )
        # Until run() asks the broker for its topics' limits: the producer's own.
        self.outcomes = Outcomes(
            self.producer,
            self._acked,
            self.topics,
            worker_limits(cfg, self.pipeline, self.producer, self.topics, {}),
            metrics=self.metrics,
            pipeline=cfg.pipeline,
            sinks=self.sinks,
            on_undeliverable=cfg.limits.on_undeliverable,
            count=self.stats.count,
            fail=self.fail,
            transactions=self.transactions,
            carry_headers=cfg.result_headers, origin=Origin(self.group_id, member_id(cfg.instance_id()), class_path(self.step.codec)),
        )
        # Route records before decoding them (admission.py): only where the configured
        # outcome of expiry is "routed late" anyway; tenant classes over their share first.
        routes = self.policy.separates_late and b.expiry_action == "route_late"
        self.admission = Admission(
            self.step.codec, lambda priority: cfg.slo_seconds(priority) * 1000.0, self.outcomes,
            lambda: self.outcomes.limits.request_bytes, max_budget_ms(cfg.tenants, b) if routes else None,
            tenant_budget_ms(cfg.tenants, b, self.queue.batcher.tenants), reserve=b.shed_reserve,
            tenants=gate_standing(self.queue, self.metrics.tenants),
        )
        self.publisher = Publisher(
            self.step.hooks, self.outcomes, self.tracker, self.sinks, self.metrics, cfg.pipeline, b.policy,
            self.stats, lambda: self._drain_deadline, self.fail, self.tracer, self.admission.observe_answers,
        )
        self._executor_pool = Executors(self.queue, self.slot, self.publisher.hand_over, self.outcomes.dead_letter)
        self.source: Source | None = None  # created in run(): joining the group is the last step
        self.partitions = Partitions(
            self.tracker, lambda: self.source, self.producer, self.sinks, self.metrics, cfg.pipeline,
            self.stats, self._serve_outcomes, self.transactions, self.kafka_progress,
        )
        self.started = threading.Event()  # model loaded, source subscribed
        self.last_poll_ok: float | None = None

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
        self.outcomes.limits = described_limits(self.cfg, self.pipeline, self.producer, self.topics)
        if self.transactions is not None:
            self.transactions.start()  # before joining the group: fences our predecessor
        self.source = make_source(self.cfg, self.group_id, [self.input_topic], self.partitions.on_assign,
                                  self.partitions.on_revoke, self.outage_log.broker_stats, self.credentials)
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
                if self.credentials is not None:  # a refused login: new password, or the one line
                    self.credentials.check()
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
                    self.outage_log.sample(now, len(self.producer), len(self.tracker.committable()), self._acks)
                    next_lag = now + _LAG_INTERVAL
            return self._shutdown()
        except Exception as exc:  # a missing ACL or a refused login (KafkaRefused) is its one line, not a traceback
            log.error("worker failed; offsets not committed past finished work", exc_info=not isinstance(exc, KafkaRefused))
            self.fail(str(exc) if isinstance(exc, KafkaRefused) else f"source loop failed: {type(exc).__name__}: {exc}")
            return self._shutdown(commit=True)

    def _acked(self, rec: SourceRecord) -> None:
        """An outcome record is durable: its offset is done, and Kafka takes writes (a
        count, not a clock read per record: the outage watch samples it each second)."""
        self.tracker.ack(rec.tp, rec.offset)
        self._acks += 1

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
        self._drain_deadline = time.monotonic() + self.cfg.drain_timeout_s
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

    # ------------------------------------------------------------------ source side
    def _admit(self, records: list[SourceRecord]) -> None:
        notify(self.sinks, "track", records)  # offset-ordered sinks (Parquet) must see every offset
        self.tracker.track_many([(rec.tp, rec.offset) for rec in records])
        if self.transactions is not None:
            self.transactions.track(records)
        requests = self.admission.admit(records, self.clock.now(), wall_ms())
        self.stats.count("consumed", len(records))
        if requests:
            self.queue.put_many(requests)
        self._queue_rows_gauge.set(self.queue.rows)

    def _serve_outcomes(self) -> None:
        self._route_late()
        if self.transactions is not None:  # exactly_once: produce the outcomes now in line
            self.transactions.release()

    def _route_late(self) -> None:
        route_late(self.queue, self.outcomes, self.metrics.tenants)

    def _apply_backpressure(self) -> IntakeDecision:
        """Hold or pause consumption by the queue's backpressure rows (batching/backpressure.py
        says why holding, not pausing, is the usual answer)."""
        return follow_intake(self.backpressure, self.queue.backpressure_rows, time.monotonic(), self.source,
                             self.metrics, self.cfg.pipeline, self.stats, "queue at %d rows")

    @property
    def assigned(self) -> list[TopicPartition]:
        """The partitions this worker owns now."""
        return self.partitions.assigned

    # ------------------------------------------------------------------ reporting
    def stats_line(self) -> str:
        return self.stats.line()
