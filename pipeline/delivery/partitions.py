"""The partitions a worker owns: offset commits of done work, lag, and the rebalance
callbacks (run in the source thread, inside the source's poll_batch()).

Offsets are committed only up to each partition's contiguous done watermark
(consumers/offsets.py), after the sinks have acked their rows: at-least-once. A
revoked partition's in-flight work is waited for (up to REVOKE_WAIT s) and committed
before the partition is let go; what is still pending then is replayed by its next
owner. With delivery exactly_once a commit is the transaction's (transactions.py):
a revoke commits it, or aborts it and drops the revoked partitions' records.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from consumers.client_logs import KafkaLog
from consumers.offsets import OffsetTracker
from consumers.records import Producer, TopicPartition
from pipeline.delivery.kafka_progress import COMMIT, KafkaProgress
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.transactions import Transactions
from pipeline.observe.metrics import WorkerMetrics
from pipeline.sinks import ResultSink, notify

log = logging.getLogger(__name__)

REVOKE_WAIT = 10.0  # s a revoked partition's in-flight work may take before it is let go


class Partitions:
    """tracker: the offsets of every consumed record; lifecycle: the Kafka source (None
    before the loop joins the group) and the partitions owned, which the rebalance
    callbacks here keep (pipeline/delivery/lifecycle.py); producer: to serve delivery
    reports while a revoke waits; serve_outcomes(): routes late requests meanwhile (the
    source loop's other duty); progress: told of each commit's success or failure
    (outage watch)."""

    def __init__(
        self,
        tracker: OffsetTracker,
        lifecycle: Lifecycle,
        producer: Producer,
        sinks: list[ResultSink],
        metrics: WorkerMetrics,
        pipeline: str,
        stats: WorkerStats,
        serve_outcomes: Callable[[], None],
        transactions: Transactions | None = None,
        progress: KafkaProgress | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tracker = tracker
        self.lifecycle = lifecycle
        self.producer = producer
        self.sinks = sinks
        self.metrics = metrics
        self.pipeline = pipeline
        self.stats = stats
        self.serve_outcomes = serve_outcomes
        self.transactions = transactions
        self.progress = progress
        # Failed commits, one line per failure and 10 s with a count of its repeats:
        # after a member was SIGKILLed, its survivor's asynchronous commits, queued
        # while the group waited out the dead member's session (~39 s), all failed at
        # once: 185 identical "offset commit failed: ILLEGAL_GENERATION" lines in
        # 164 ms (issue 49). consumers/client_logs.py's limiter, on this logger.
        self._commit_failures = KafkaLog(log, clock=clock)

    # ------------------------------------------------------------------ commits
    def commit(self, only: list[TopicPartition] | None = None, *, wait: bool = True) -> None:
        """Commit the done watermarks (of `only`'s partitions). wait=False: the result
        comes later, in a poll; revoke and shutdown wait, as the partitions or the
        group are let go right after. An older asynchronous commit that lands after
        a newer one only moves a watermark back: a replay, never a loss.
        exactly_once: the open transaction commits, with every partition's offsets;
        wait=True means these partitions (all, without `only`) are being let go."""
        self._commit_failures.flush()  # the count of a storm that has ended
        if self.transactions is not None:
            letting_go = (only if only is not None else self.lifecycle.assigned) if wait else []
            self.transactions.commit(letting_go)
            return
        source = self.lifecycle.source
        if source is None:
            return
        offsets = self.tracker.committable()
        if only is not None:
            wanted = set(only)
            offsets = {tp: o for tp, o in offsets.items() if tp in wanted}
        if not offsets:
            return
        if not wait:
            source.commit(offsets, on_done=lambda err: self.committed(err, offsets))
            return
        try:
            source.commit(offsets)
        except Exception as exc:
            self.committed(exc, offsets)
        else:
            self.committed(None, offsets)

    def committed(self, err: Exception | None, offsets: dict[TopicPartition, int]) -> None:
        if err is None:
            self.tracker.committed(offsets)
            self.metrics.commits.labels(self.pipeline, "ok").inc()
            self.stats.count("commits")
            if self.progress is not None:
                self.progress.ok(COMMIT, time.monotonic())
        else:  # not marked committed: offered again at the next interval (tracker.committable)
            self.metrics.commits.labels(self.pipeline, "error").inc()
            if self.progress is not None:
                self.progress.failed(COMMIT)
            self._commit_failures.emit(logging.WARNING, f"offset commit failed: {err}")

    def update_lag(self) -> None:
        source = self.lifecycle.source
        if source is None:
            return
        try:
            # Only a paused source asks the broker (its cached watermark is frozen): that
            # query blocks this thread for a round trip per partition, and a hold is
            # short and frequent under load (asking then cost seconds-long stalls, p99).
            for (topic, partition), lag in source.lag().items():
                self.metrics.lag.labels(topic, str(partition)).set(lag)
        except Exception as exc:
            log.debug("lag update failed: %s", exc)

    # ------------------------------------------------------------------ rebalances
    def on_assign(self, tps: list[TopicPartition]) -> None:
        owned = self.lifecycle.assigned = sorted(set(self.lifecycle.assigned) | set(tps))
        self.metrics.assigned.labels(self.pipeline).set(len(owned))
        log.info("assigned %s", tps)

    def on_revoke(self, tps: list[TopicPartition]) -> None:
        """Finish the in-flight work of revoked partitions, commit it, let go. Never
        commit past work that was not done: what is still pending after the wait is
        replayed by the partition's next owner."""
        if not tps:
            return
        notify(self.sinks, "revoke", tps)  # sinks finish these partitions' files once drained
        deadline = time.monotonic() + REVOKE_WAIT
        while any(self.tracker.pending(tp) for tp in tps) and time.monotonic() < deadline:
            self.serve_outcomes()
            self.producer.poll(0.01)
            for sink in self.sinks:
                sink.poll()
        if any(self.tracker.pending(tp) for tp in tps):
            for sink in self.sinks:
                sink.flush()
            self.producer.flush(2.0)
        self.commit(only=tps)
        self.tracker.forget(tps)
        if self.transactions is not None:
            self.transactions.forget(tps)
        owned = self.lifecycle.assigned = sorted(set(self.lifecycle.assigned) - set(tps))
        self.metrics.assigned.labels(self.pipeline).set(len(owned))
        for topic, partition in tps:
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(topic, str(partition))
        log.info("revoked %s", tps)
