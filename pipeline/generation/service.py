"""The `generate` worker's loop: Kafka requests in, token chunks and one final record
per request out, with the generation scheduler (pipeline/generation/scheduler.py)
deciding each step and the runner (pipeline/generation/runner.py) running it on the
decoder.

Why not the request-batching Worker (pipeline/worker/core.py): a request there is
scored in one batch and done; here a request spans many decoding steps, and the
batch changes at every step. So this is a loop of its own, one thread: poll, admit,
one step, send what it produced, commit. It reuses the worker's parts for what is
the same: the OffsetTracker (consumers/offsets.py), Outcomes for final records and
dead letters (pipeline/delivery/outcomes.py, consumers/dead_letter.py) and Partitions for
commits and rebalances (pipeline/delivery/partitions.py).

Delivery: a request's offset is done only when its final record is acknowledged by
Kafka; chunks are sent on the way and not waited for. A worker that dies leaves the
offsets of unfinished requests uncommitted, so the next one generates them again
under a new attempt id (pipeline/generation/records.py says how a reader drops the
repeated chunks; docs/GENERATION.md, "Delivery").
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from consumers.dead_letter import record_bytes
from consumers.offsets import OffsetTracker
from consumers.records import Producer, SendError, Source, SourceRecord, TopicPartition
from pipeline.batching.backpressure import Backpressure
from pipeline.clock import wall_ms
from pipeline.delivery.intake import follow_intake
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.outcomes import Outcomes
from pipeline.delivery.partitions import Partitions
from pipeline.delivery.stats import WorkerStats
from pipeline.generation.records import FINISH_DEADLINE, Timing, chunk_value, final_value
from pipeline.generation.requests import BadRequest, parse_request
from pipeline.generation.runner import DecoderRunner, gen_request
from pipeline.generation.scheduler import GenerationScheduler
from pipeline.generation.sequence import FINISH_LENGTH, FINISH_STOP, REFUSED, Outcome
from pipeline.generation.stream import Chunk, Generation
from pipeline.observe.metrics import WorkerMetrics

log = logging.getLogger(__name__)

PIPELINE = "generate"


@dataclass(frozen=True, slots=True)
class GenerateSettings:
    """The loop's knobs (flags of `tidebatch generate`, pipeline/commands/generate.py)."""

    chunk_tokens: int = 16  # a chunk goes out with this many tokens ready ...
    flush_ms: float = 100.0  # ... or when its oldest unsent token waited this long
    max_new_tokens: int = 200  # the largest max_new_tokens a request may ask for
    deadline_ms: float = 30_000.0  # admission budget of a request without deadline_ms
    max_waiting: int = 256  # requests queued before intake holds (pipeline/batching/backpressure.py)
    poll_records: int = 64
    commit_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    model: str = "decoder_tiny"


@dataclass(slots=True, eq=False)
class _Job:
    rec: SourceRecord  # keyed by request (the chunks' key), so the final lands with them
    gen: Generation
    attempt: str
    arrival: float  # worker clock at poll, s
    age_ms: float  # the record's age when polled (wall clock minus its timestamp)


class GenerationLoop:
    def __init__(
        self,
        *,
        producer: Producer,
        outcomes_for: Callable[[Callable[[SourceRecord], None], Callable[[str], None]], Outcomes],
        scheduler: GenerationScheduler,
        runner: DecoderRunner,
        settings: GenerateSettings,
        metrics: WorkerMetrics,
        context: int,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], int] = wall_ms,
    ) -> None:
        """outcomes_for(ack, fail): the Outcomes that sends final records and dead
        letters, acking offsets into this loop's tracker and stopping it on a failure."""
        self.producer = producer
        self.tracker = OffsetTracker()
        self.outcomes = outcomes_for(lambda rec: self.tracker.ack(rec.tp, rec.offset), self.fail)
        self.scheduler = scheduler
        self.runner = runner
        self.settings = settings
        self.metrics = metrics
        self.context = context
        self.clock = clock
        self.wall = wall
        self.stats = WorkerStats()
        self.lifecycle = Lifecycle()  # the source, once run() has it, and the partitions owned
        self.partitions = Partitions(self.tracker, self.lifecycle, producer, [], metrics, PIPELINE,
                                     self.stats, self._step)
        self.jobs: dict[str, _Job] = {}  # by scheduler id: topic/partition/offset
        # Hold intake, not pause, while requests wait for slots: pause() purges what
        # librdkafka prefetched and resume() refetches only on its broker thread's next
        # wake-up. Pausing at max_waiting left a saturated continuous worker with
        # nothing to decode for ~0.13 s of every second on the embedded broker (0.87 s
        # from resume to the first record); pipeline/batching/backpressure.py holds,
        # trickles one record a tick for the group's liveness, and pauses only a
        # queue that does not drain.
        self.backpressure = Backpressure(settings.max_waiting, settings.max_waiting // 2,
                                         poll_records=settings.poll_records)
        # The request worker's histograms, read the same way by `tidebatch status`, the
        # dashboards and the alerts (docs/GENERATION.md, "Ops endpoints"): a decoding
        # step is a batch of its sequences, a step's time the model's, a final record's
        # latency the end-to-end one.
        m = metrics
        self._h_rows = m.batch_rows.labels(m.pipeline, m.policy)
        self._h_step = m.inference.labels(m.pipeline)
        self._h_e2e = m.e2e.labels(m.pipeline)
        self._h_to_worker = m.stage.labels(m.pipeline, "to_worker")
        self.exit_code = 0
        self._stopping: str | None = None
        self._chunk_failures = 0
        # Read by the ops endpoints (pipeline/generation/ops.py), as a Worker's are.
        self.started = threading.Event()  # the loop is polling
        self.last_poll_ok: float | None = None  # clock() of the last poll that returned
        self.failure: str | None = None

    # -- control --------------------------------------------------------------------
    def stop(self, reason: str) -> None:
        if self._stopping is None:
            log.info("stopping: %s", reason)
            self._stopping = reason

    def fail(self, reason: str) -> None:
        log.error("%s", reason)
        self.exit_code = 1
        self.failure = self.failure or reason
        self.stop(reason)

    @property
    def stopping(self) -> bool:
        return self._stopping is not None

    def on_revoke(self, tps: list[TopicPartition]) -> None:
        """Partitions.on_revoke steps the decoder while it waits for their requests;
        those still unfinished are cancelled here: their next owner generates them."""
        self.partitions.on_revoke(tps)
        gone = set(tps)
        keys = [k for k, j in self.jobs.items() if j.rec.tp in gone]
        self.scheduler.cancel(keys, self.clock())
        for k in keys:
            del self.jobs[k]

    # -- the loop -------------------------------------------------------------------
    def run(self, source: Source) -> int:
        self.lifecycle.source = source
        last_commit = self.clock()
        self.started.set()
        while self._stopping is None:
            self._poll(source)
            self._step()
            self.producer.poll(0)
            self.outcomes.observe_stages()
            if self.clock() - last_commit >= self.settings.commit_interval_s:
                self.partitions.commit(wait=False)
                last_commit = self.clock()
        self._drain(source)
        return self.exit_code

    def _drain(self, source: Source) -> None:
        """Finish what is admitted and waiting, within drain_timeout_s; what is left
        stays uncommitted, for the partition's next owner."""
        if self.exit_code == 0:
            source.pause_all()
            until = self.clock() + self.settings.drain_timeout_s
            while self.scheduler.has_work and self.clock() < until:
                self._step()
                self.producer.poll(0)
            if self.scheduler.has_work:
                log.warning("shutdown: %d requests unfinished, left to the next worker", len(self.jobs))
        left = self.producer.flush(10.0)
        if left:
            log.warning("shutdown: %d records without a delivery report", left)
        if self.exit_code == 0:
            self.partitions.commit(wait=True)
        source.close()

    def _poll(self, source: Source) -> None:
        intake = follow_intake(self.backpressure, self.scheduler.waiting, self.clock(), source, self.metrics,
                               PIPELINE, self.stats, "%d requests waiting")
        if not intake.max_records:
            self.last_poll_ok = self.clock()  # holding: the decoder works through what waits
            return
        timeout = 0.0 if self.scheduler.has_work else 0.1
        records = source.poll_batch(intake.max_records, timeout)
        self.last_poll_ok = self.clock()
        for rec in records:
            self._admit(rec)

    def _admit(self, rec: SourceRecord) -> None:
        key = f"{rec.topic}/{rec.partition}/{rec.offset}"
        if key in self.jobs:
            return  # redelivered while it runs (a seek back): one outcome is enough
        self.tracker.track(rec.tp, rec.offset)
        self.stats.count("consumed")
        size = record_bytes(rec.key, rec.value, list(rec.headers.items()))
        limit = self.outcomes.limits.request_bytes
        if size > limit:
            self.outcomes.dead_letter(rec, f"request is {size} bytes, over the {limit}-byte limit", "admit")
            return
        try:
            parsed = parse_request(rec.value, key, context=self.context, max_new_tokens=self.settings.max_new_tokens)
        except BadRequest as exc:
            self.outcomes.dead_letter(rec, str(exc), "admit", error="BadRequest")
            return
        now, wall = self.clock(), self.wall()
        age_ms = max(wall - rec.timestamp_ms, 0) if rec.timestamp_ms else 0
        budget_ms = parsed.deadline_ms if parsed.deadline_ms is not None else self.settings.deadline_ms
        deadline = now + (budget_ms - age_ms) / 1000.0
        gen = parsed.gen
        keyed = replace(rec, key=rec.key or gen.request_id.encode("utf-8"))
        job = _Job(keyed, gen, uuid.uuid4().hex[:16], now, float(age_ms))
        self._h_to_worker.observe(age_ms / 1000.0)
        refused = self.scheduler.submit(gen_request(gen, now, deadline, parsed.priority, key=key))
        if refused is not None:
            self.outcomes.dead_letter(rec, refused.detail, "admit")
            return
        self.jobs[key] = job

    # -- one step -------------------------------------------------------------------
    def _step(self) -> None:
        plan = self.scheduler.plan(self.clock())
        for outcome in plan.expired:
            self._finish(outcome)
        if plan.empty:
            return
        began = self.clock()
        result = self.runner.run(plan)
        now = self.clock()
        self._h_step.observe(now - began)
        if plan.decode:
            self._h_rows.observe(len(plan.decode))
        finished = self.scheduler.complete(plan, now, result.stopped)
        done = {o.request.request_id for o in finished}
        s = self.settings
        for seq in plan.emitting:
            if seq.request_id not in done:
                job = self.jobs[seq.request_id]
                chunk = job.gen.chunk(now, s.chunk_tokens, s.flush_ms / 1000.0)
                if chunk is not None:
                    self._send_chunk(job, chunk)
        for outcome in finished:
            self._finish(outcome)

    def _send_chunk(self, job: _Job, chunk: Chunk) -> None:
        value = chunk_value(job.gen, job.attempt, chunk)
        self.producer.send(self.outcomes.topics.output, job.rec.key, value, None, self._chunk_sent)

    def _chunk_sent(self, err: SendError | None) -> None:
        # Not retried and no offset waits for it: the final record carries the whole
        # text, and a reader sees the gap by `offset` (pipeline/generation/records.py).
        if err is not None:
            self._chunk_failures += 1
            if self._chunk_failures == 1 or self._chunk_failures % 1000 == 0:
                log.warning("a chunk was not delivered (%d so far): %s", self._chunk_failures, err.reason)

    def _finish(self, outcome: Outcome) -> None:
        job = self.jobs.pop(outcome.request.request_id)
        if outcome.reason == REFUSED:  # submit() refuses at once; kept for completeness
            self.outcomes.dead_letter(job.rec, outcome.detail, "admit")
            return
        reason = outcome.reason if outcome.reason in (FINISH_STOP, FINISH_LENGTH) else FINISH_DEADLINE
        last = job.gen.last_chunk()
        if last is not None:
            self._send_chunk(job, last)
        first = outcome.first_token_at
        timing = Timing(
            ttft_ms=None if first is None else (first - job.arrival) * 1000.0 + job.age_ms,
            latency_ms=(outcome.at - job.arrival) * 1000.0 + job.age_ms,
            decode_s=0.0 if first is None else outcome.at - first,
            to_worker_ms=job.age_ms,
        )
        value = final_value(job.gen, job.attempt, reason, timing, job.rec, self.settings.model)
        too_large = self.outcomes.result_too_large(job.rec, value)
        if too_large:
            self.outcomes.dead_letter(job.rec, too_large, "publish")
            return
        self.outcomes.result(job.rec, value, ready_wall_ms=self.wall())
        self.metrics.outcome(job.rec.topic, "generated" if reason != FINISH_DEADLINE else "deadline")
        self._h_e2e.observe(timing.latency_ms / 1000.0)
        self.stats.count("scored")
