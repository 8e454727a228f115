"""The publisher thread: builds the result documents, produces them and hands the rows
to the sinks, in dispatch order (pipeline/delivery/reorder.py).

Off the executors, so that this Python work (about a fifth of an in-process
executor's time at saturation) never delays the model's next batch. Every request
gets exactly one outcome here: its result, or its dead letter when the result cannot
be serialised or is over the output topic's limit, or (a hook's verdict) nothing
published for a replay whose first outcome already was.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import orjson

from consumers.offsets import OffsetTracker
from consumers.records import SourceRecord, produced_ms
from models.registry import ModelSpec
from pipeline.batching.request import Batch, Request
from pipeline.clock import wall_ms
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.outcomes import Outcomes, result_value
from pipeline.delivery.reorder import Reorder
from pipeline.delivery.stats import WorkerStats
from pipeline.hooks import WorkerHook
from pipeline.observe.metrics import WorkerMetrics, observe_many
from pipeline.observe.tracing import BatchTracer, RequestTrace
from pipeline.runtime import thread_names
from pipeline.scoring import BatchTiming, result_document
from pipeline.sinks import ResultSink, ScoredRow, notify
from pipeline.worker.admission import InFlight
from pipeline.worker.executors import Done, Finished, dead_letter_internal

log = logging.getLogger(__name__)

PUBLISH_BACKLOG = 4  # finished batches waiting for the publisher before executors wait
HANDOFF_WAIT = 0.1  # s; an executor re-checks the publisher this often while handing over


class _BeforeOutcomes(Exception):
    """Publishing a part failed before any of its requests had an outcome."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class Publisher:
    """Publishes what the executors finished, in the order the batches were dispatched.

    hooks: see the result documents before they are sent (pipeline/hooks.py).
    outcomes: sends results and dead letters (pipeline/delivery/outcomes.py).
    tracker: the offsets; a result with sinks is done when every sink acked its row.
    sinks: the offline sinks (a list the caller may still extend before run()).
    lifecycle: its drain deadline, the monotonic time shutdown must end by (None while
        running; pipeline/delivery/lifecycle.py).
    fail: stops the worker with an error (a sink that failed).
    answered: gets each batch's ms from decode to answer (admission's shed reserve,
        pipeline/batching/shed.py AnswerTime) and from the model's end to its last
        result (the answer tail taken off the batcher's deadlines, pipeline/batching/
        tail.py).
    encode: a result document's value; None: JSON (a schema-registry codec's
        `encode_result` writes its records).
    """

    def __init__(
        self,
        hooks: Sequence[WorkerHook],
        outcomes: Outcomes,
        tracker: OffsetTracker,
        sinks: list[ResultSink],
        metrics: WorkerMetrics,
        pipeline: str,
        policy: str,
        stats: WorkerStats,
        lifecycle: Lifecycle,
        fail: Callable[[str], None],
        tracer: BatchTracer | None = None,
        answered: Callable[[list[float], float], None] = lambda ms, tail: None,
        encode: Callable[[dict[str, Any]], bytes] | None = None,
    ) -> None:
        self.hooks = list(hooks)
        self._by_version: dict[str, Any] = {}  # model version -> its requests counter
        self.outcomes = outcomes
        self.tracker = tracker
        self.sinks = sinks
        self.metrics = metrics
        self.pipeline = pipeline
        self.policy = policy
        self.stats = stats
        self.lifecycle = lifecycle
        self.fail = fail
        self.tracer = tracer  # spans of each published request and its batch, when tracing is on
        self.answered = answered
        self.encode = encode or orjson.dumps  # a result's value: JSON, or the codec's records (schema_wire.py)
        # Per-request metrics, bound once: labels() costs a lock and a dict lookup.
        self._queue_wait_hist = metrics.queue_wait.labels(pipeline)
        self._e2e_hist = metrics.e2e.labels(pipeline)
        self._stage = {
            name: metrics.stage.labels(pipeline, name) for name in ("to_broker", "to_worker", "decode", "queue", "model")
        }
        self._children: dict[tuple[Any, ...], Any] = {}  # (metric, labels...) -> its child, bound on first use
        self._finished: queue.Queue[Done | None] = queue.Queue(maxsize=PUBLISH_BACKLOG)
        self.thread: threading.Thread | None = None

    def start(self, guarded: Callable[[str, Callable[[], None]], Callable[[], None]]) -> None:
        self.thread = threading.Thread(target=guarded("publisher", self.loop), name="publisher", daemon=True)
        self.thread.start()

    def hand_over(self, done: Done | None) -> bool:
        """Give the publisher a finished batch (None: no more will come). Never blocks
        for ever: gives up once the publisher is dead or the drain time has run out
        (that batch's requests then stay uncommitted and are replayed)."""
        while True:
            try:
                self._finished.put(done, timeout=HANDOFF_WAIT)
                return True
            except queue.Full:
                if self.thread is None or not self.thread.is_alive():
                    return False
                deadline = self.lifecycle.drain_deadline
                if deadline is not None and time.monotonic() >= deadline:
                    return False

    def loop(self) -> None:
        """Publish finished batches in dispatch order. With several batches in flight
        an executor can hand its batch over before one dispatched earlier (the model
        process answers in order, the executors then race for the GIL), and results
        of one key, e.g. one camera's frames, must come out in the order they went in
        (pipeline/delivery/reorder.py)."""
        thread_names.name_current_thread("publisher")  # for per-thread CPU (runtime/thread_names.py)
        in_order: Reorder[list[Finished]] = Reorder()
        while True:
            done = self._finished.get()
            if done is None:
                break
            for parts in in_order.add(done.seq, done.parts):
                for part in parts:
                    self.publish_part(part)
        for parts in in_order.rest():  # a lost number (a dead executor): publish the rest
            for part in parts:
                self.publish_part(part)

    def publish_part(self, done: Finished) -> None:
        """Publish one finished part. Every request gets exactly one outcome, whatever
        fails: publish gives each its own, and a bug before it gave any (a hook, the
        result documents) dead-letters them all with the error."""
        try:
            timing = BatchTiming(done.batch_rows, done.seconds, done.started_wall, wall_ms())
            self.publish(done.batch.requests, done.results, timing, done.model)
        except _BeforeOutcomes as exc:
            log.error("publishing a batch failed", exc_info=exc.__cause__)
            dead_letter_internal(self.outcomes.dead_letter, done.batch.requests, exc.error, "publish")
            return
        if done.is_batch:
            self._count_batch(done.batch, done.seconds)

    def _count_batch(self, batch: Batch, seconds: float) -> None:
        m = self.metrics
        self._child(m.batches, self.pipeline, self.policy, batch.reason).inc()
        self._child(m.batch_rows, self.pipeline, self.policy).observe(batch.rows)
        self._child(m.inference, self.pipeline).observe(seconds)
        self.stats.count_many(batches=1, batch_rows=batch.rows)

    def _child(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), looked up once: labels() takes a lock and checks its
        arguments, and a drain's batches hold ~13 CTR requests, so the publisher's
        per-batch metrics cost about as much as its per-request work (docs/PEERS.md,
        "Per-request Python, issue 46")."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _version_counter(self, version: str) -> Any:
        counter = self._by_version.get(version)
        if counter is None:
            counter = self._by_version[version] = self.metrics.version_requests.labels(self.pipeline, version)
        return counter

    def publish(self, requests: list[Request], results: list[dict] | None, timing: BatchTiming, model: ModelSpec) -> None:
        """One outcome per request: its result, or its dead letter when the result
        cannot be serialised or is over the output topic's limit (decided here, before
        anything is sent, so that one request's result never touches its batch-mates').
        `model`: the version that scored them. Raises _BeforeOutcomes if it failed
        before any request had its outcome."""
        infs: list[InFlight] = [req.item for req in requests]
        try:
            assert results is not None and len(results) == len(requests)
            docs = [
                result_document(model, inf.decoded, inf.rec, result, timing, inf.consumed_wall_ms, inf.deadline_wall_ms)
                for inf, result in zip(infs, results, strict=True)
            ]
            keep = [True] * len(docs)
            for hook in self.hooks:
                verdicts = hook.after_inference([inf.rec for inf in infs], docs)
                keep = [k and v for k, v in zip(keep, verdicts, strict=True)]
        except Exception as exc:
            raise _BeforeOutcomes(exc) from exc
        self._version_counter(model.version).inc(len(requests))
        counts = {"ok": 0, "late": 0, "duplicate": 0}
        rows: list[ScoredRow] = []
        queue_waits: list[float] = []
        e2e: list[float] = []
        to_broker: list[float] = []
        to_worker: list[float] = []
        decode: list[float] = []
        queued: list[float] = []
        done_wall = timing.done_wall
        model_end = timing.started_wall + int(timing.seconds * 1000)
        traces: list[RequestTrace] = []
        by_tenant: list[tuple[str, bool, float | None]] = []  # with a `tenants:` section only
        for req, inf, doc, publish in zip(requests, infs, docs, keep, strict=True):
            rec = inf.rec
            if not publish:
                # Dropped replay: its first outcome was already published.
                counts["duplicate"] += 1
                notify(self.sinks, "skip", [rec])
                self.outcomes.settle(rec)
                continue
            refused = self._unpublishable(rec, doc)
            if isinstance(refused, str):
                self.outcomes.dead_letter(rec, refused, "publish")
                continue
            # Exactly one outcome per record: a replay is a duplicate, whatever its timing.
            counts["duplicate" if doc.get("duplicate") else "late" if doc["late"] else "ok"] += 1
            if self.sinks:
                self.tracker.add_acks(rec.tp, rec.offset, len(self.sinks))
                rows.append(ScoredRow(rec, inf.decoded, doc, lambda rec=rec: self.tracker.ack(rec.tp, rec.offset)))
            trace = None if self.tracer is None else self.tracer.request(
                rec, inf.consumed_wall_ms, timing.started_wall, model_end)
            if trace is not None:
                traces.append(trace)
            self.outcomes.result(rec, refused, done_wall, trace.headers if trace else None)
            queue_waits.append(max(timing.started_wall - inf.consumed_wall_ms, 0) / 1000.0)
            decoded_wall = inf.decoded_wall_ms or inf.consumed_wall_ms
            decode.append(max(decoded_wall - inf.consumed_wall_ms, 0) / 1000.0)
            queued.append(max(timing.started_wall - decoded_wall, 0) / 1000.0)
            if rec.timestamp_ms is not None:
                e2e.append(max(done_wall - rec.timestamp_ms, 0) / 1000.0)
                to_worker.append(max(inf.consumed_wall_ms - rec.timestamp_ms, 0) / 1000.0)
                # A LogAppendTime timestamp is the broker's append: with the producer's
                # own produce() time in a header, the produce leg is known too, and
                # to_worker above is append -> polled (docs/OPERATIONS.md, "Where the
                # time goes"). With CreateTime the append time is unknown: no to_broker.
                if rec.log_append_time:
                    produced = produced_ms(rec.headers)
                    if produced is not None:
                        to_broker.append(max(rec.timestamp_ms - produced, 0) / 1000.0)
            if req.tenant_class is not None:
                by_tenant.append((req.tenant_class, bool(doc["late"]), e2e[-1] if rec.timestamp_ms is not None else None))
        if traces:
            self.tracer.batch(traces, timing.batch_rows, timing.started_wall, model_end)  # type: ignore[union-attr]
        observe_many(self._queue_wait_hist, queue_waits)
        observe_many(self._e2e_hist, e2e)
        if by_tenant and self.metrics.tenants is not None:
            self.metrics.tenants.observe(by_tenant)
        # Where the time went (docs/OPERATIONS.md, "Where the time goes").
        observe_many(self._stage["to_broker"], to_broker)
        observe_many(self._stage["to_worker"], to_worker)
        observe_many(self._stage["decode"], decode)
        observe_many(self._stage["queue"], queued)
        handed = wall_ms()  # every result of the batch is with the producer now
        self.answered([handed - (inf.decoded_wall_ms or inf.consumed_wall_ms) for inf in infs], handed - model_end)
        observe_many(self._stage["model"], [timing.seconds] * len(queue_waits))
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
            self._child(self.metrics.slo_misses, self.pipeline).inc(counts["late"])
        self.stats.count_many(
            scored=counts["ok"] + counts["late"], scored_late=counts["late"], duplicates=counts["duplicate"]
        )

    def _unpublishable(self, rec: SourceRecord, doc: dict) -> bytes | str:
        """The result record's value, or why this result cannot be published."""
        return result_value(doc, partial(self.outcomes.result_too_large, rec), self.encode)
