"""Delivery exactly_once: outcome records and input offsets in one Kafka transaction.

How (docs/DELIVERY.md):
- every outcome record (result, dead letter, late record) goes through `deliver()`,
  which holds it until every earlier offset of its partition has its outcome
  (consumers/release.py); the source thread produces what is released, so the open
  transaction only ever holds a prefix of each partition's offsets;
- every `interval_s` the source thread commits: it flushes the producer (a failed
  delivery dooms the transaction) and the sinks (rows durable before their offsets
  commit, as with at-least-once), sends the released offsets with the consumer group's
  metadata (KIP-447: a member that lost its partitions is fenced by the broker) and
  commits. read_committed readers see the results then, never an aborted record;
- an abortable failure aborts: the records of the aborted transaction are kept (each
  offset's latest outcome record) and produced again in the next one, so nothing is
  scored twice and the sinks see each row once; records of partitions being let go
  are dropped instead, and their next owner replays them from the committed offsets;
- a producer that cannot go on (fenced, as an epoch bump cut short by an outage
  looks; an abort that failed) is renewed with the same transactional.id and its
  records produced again: the worker rides out an outage (docs/DELIVERY.md, item 6).

Single-threaded by design: produce, flush and commit all run in the source thread
(release/commit) or in its rebalance callbacks, so no record can be produced while a
transaction is committing. deliver() may be called from any thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

from consumers.offsets import OffsetTracker
from consumers.records import (
    SourceRecord,
    TopicPartition,
    TransactionalProducer,
    TransactionalSource,
    TransactionError,
)
from consumers.release import OrderedRelease, Submitted
from pipeline.delivery.kafka_progress import COMMIT, KafkaProgress
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.watchdog import CallWatch
from pipeline.errors import UserError
from pipeline.observe.metrics import WorkerMetrics
from pipeline.sinks import ResultSink

log = logging.getLogger(__name__)

Send = Callable[[], None]
Key = tuple[TopicPartition, int]

INIT_TIMEOUT_S = 60.0
STEP_TIMEOUT_S = 30.0  # commit and abort: a broker failover takes seconds
FLUSH_TIMEOUT_S = 5.0  # records not acked by then: the commit waits for the next interval
COMMIT_ATTEMPTS = 3  # retriable commit failures before the transaction is aborted
# Renewals allowed in a window: two live processes with one transactional.id would fence each other for ever.
MAX_RENEWALS = 3
RENEW_WINDOW_S = 600.0
RETRY_PAUSE_S = 1.0  # between attempts to reach the coordinator during an outage
ABORT_ATTEMPTS = 10  # retriable abort failures before the producer is renewed
RENEW_STEP_TIMEOUT_S = 10.0  # short, so a stop asked for meanwhile is seen soon


class Transactions:
    """producer: transactional (its transactional.id set). lifecycle: the consumer, for
    the group metadata (None before the loop joins), the partitions the worker holds
    now, and whether a stop was asked for (a renewal waiting for the cluster gives up
    then; pipeline/delivery/lifecycle.py). tracker: an offset is committed only once it
    is done there too, i.e. its sink rows are durable. fail(): stop the worker.
    progress: told of each commit's success and each abort (outage watch). calls: where
    each blocking producer call is marked with its deadline (pipeline/delivery/watchdog.py)."""

    def __init__(
        self,
        producer: TransactionalProducer,
        lifecycle: Lifecycle,
        tracker: OffsetTracker,
        sinks: Sequence[ResultSink],
        interval_s: float,
        metrics: WorkerMetrics,
        pipeline: str,
        stats: WorkerStats,
        fail: Callable[[str], None],
        progress: KafkaProgress | None = None,
        sleep: Callable[[float], None] = time.sleep,
        calls: CallWatch | None = None,
    ) -> None:
        self.producer = producer
        self.lifecycle = lifecycle
        self.tracker = tracker
        self.sinks = sinks
        self.interval_s = interval_s
        self.metrics = metrics
        self.pipeline = pipeline
        self.stats = stats
        self.fail = fail
        self.progress = progress or KafkaProgress(time.monotonic())  # None: a watch nobody reads
        self.sleep = sleep
        self.calls = calls or CallWatch()
        self._renewals: list[float] = []  # monotonic times of recent renewals
        self._renew_for: TransactionError | None = None  # the abort must renew the producer
        self._order: OrderedRelease[tuple[Key, Send]] = OrderedRelease()
        # The open transaction's records, by offset; a replacement (a refused result's
        # dead letter) takes its offset's place. Produced again after an abort.
        self._open: dict[Key, Send] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._doomed: str | None = None  # why the open transaction must be aborted
        self._aborting = False
        self._dead = False  # a fatal error: nothing more is produced or committed
        self._next_commit = 0.0

    def _source(self) -> TransactionalSource | None:
        """The consumer, once joined (make_source made it read_committed and able to
        send its offsets with a transaction, pipeline/kafka_backend.py)."""
        return self.lifecycle.source  # type: ignore[return-value]

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
        """Fence older producers with our transactional.id (their open transaction is
        aborted) and open the first transaction."""
        try:
            self.producer.init_transactions(INIT_TIMEOUT_S)
            self.producer.begin_transaction()
        except TransactionError as exc:  # no transaction support, or no ACL for our transactional.id
            raise UserError(f"delivery exactly_once: cannot start transactions: {exc.reason}") from exc
        self._next_commit = time.monotonic() + self.interval_s

    # ------------------------------------------------------------------ outcomes
    def track(self, records: Iterable[SourceRecord]) -> None:
        self._order.track((rec.tp, rec.offset) for rec in records)

    def deliver(self, rec: SourceRecord, send: Send | None) -> None:
        """The outcome of `rec`: `send` produces its record (None: it has none). Held
        until its partition's earlier offsets have theirs; a second outcome for a
        released offset (a refused record's replacement) takes the first one's place."""
        key = (rec.tp, rec.offset)
        state = self._order.submit(rec.tp, rec.offset, None if send is None else (key, send))
        if state is Submitted.RELEASED:
            if send is None:  # the outcome ends without a record after all
                self._open.pop(key, None)
            else:
                self._open[key] = send
                send()
        elif state is Submitted.UNKNOWN:
            # Its partition was let go meanwhile: the next owner replays it.
            log.debug("outcome of %s[%d]@%d dropped: partition let go", rec.topic, rec.partition, rec.offset)

    def doomed(self, reason: str) -> None:
        """A record of the open transaction failed: it must be aborted (delivery reports
        of the records an abort purges are ignored)."""
        if not self._aborting and self._doomed is None:
            self._doomed = reason

    def release(self) -> None:
        """Produce the outcomes now next in line (source thread, every loop turn)."""
        if self._dead:
            return
        for key, send in self._order.take():
            self._open[key] = send
            send()

    # ------------------------------------------------------------------ commits
    def due(self, now: float) -> bool:
        return now >= self._next_commit

    def commit(self, letting_go: Sequence[TopicPartition] = ()) -> bool:
        """Commit the open transaction with the released offsets; True if it did (or
        had nothing to commit). `letting_go`: partitions about to be revoked; if the
        transaction cannot commit it is aborted, dropping their records."""
        self._next_commit = time.monotonic() + self.interval_s
        if self._dead:
            return False
        self.release()
        letting_go = self._let_go_stale(letting_go)
        offsets = {tp: o for tp, o in self._order.released().items() if self._committed.get(tp) != o}
        if not offsets and not self._open and self._doomed is None:
            self.progress.settled()
            return True
        began = time.monotonic()
        with self.calls.call("flush", FLUSH_TIMEOUT_S * 2):
            left = self.producer.flush(FLUSH_TIMEOUT_S)  # delivery reports: a failure dooms it
        for sink in self.sinks:
            sink.flush()
        waiting = self._not_ready(offsets, left)
        if self._doomed is None and waiting is None:
            if self._commit(offsets, began) or self._dead:
                return not self._dead
        elif self._doomed is None and not letting_go:
            log.info("transaction not committed yet: %s", waiting)
            return False
        self._abort(letting_go)
        return False

    def _let_go_stale(self, letting_go: Sequence[TopicPartition]) -> Sequence[TopicPartition]:
        """Partitions this transaction holds outcomes of but the worker does not own (a
        rebalance let them go while their records were still on their way in): a member
        back in the group passes the broker's generation check whatever partitions it
        names, so their offsets and records must never commit. Those with records in
        the open transaction are let go with it (abort); the others are forgotten now."""
        owned = set(self.lifecycle.assigned)
        stale = [tp for tp in self._order.partitions() if tp not in owned and tp not in letting_go]
        if not stale:
            return letting_go
        with_records = {key[0] for key in self._open} & set(stale)
        log.warning("outcomes of %d partitions this worker does not own are dropped: %s", len(stale), stale)
        self.forget(stale)  # what they still hold is never released; their records go with the abort
        if not with_records:
            return letting_go
        self.doomed(f"it holds records of partitions this worker does not own: {sorted(with_records)}")
        return [*letting_go, *sorted(with_records)]

    def _not_ready(self, offsets: dict[TopicPartition, int], unacked: int) -> str | None:
        """Why the transaction cannot commit these offsets yet, or None."""
        if unacked:
            return f"{unacked} records not acknowledged within {FLUSH_TIMEOUT_S:.0f} s"
        for tp, offset in offsets.items():
            done = self.tracker.watermark(tp)
            if done is None or done < offset:
                return f"{tp[0]}[{tp[1]}] rows before offset {offset} not durable in every sink yet"
        return None

    def _commit(self, offsets: dict[TopicPartition, int], began: float) -> bool:
        """Commit; `began`: when the flush before it started (the source loop stands
        still from then on, which tidebatch_transaction_commit_seconds shows)."""
        source = self._source()
        # The metadata first, membership second: librdkafka may forget the member id
        # between the two calls, and metadata taken after that carries no member id.
        metadata = source.group_metadata() if source is not None else None
        if source is not None and not source.in_group():
            # A session that expired while this process stood still (a zombie): librdkafka
            # has dropped its member id, so the offsets would go with neither member id
            # nor generation, which the broker takes unchecked (KIP-447 checks them only
            # when given), past what the partitions' new owner has committed. Abort: the
            # records are produced again once the group is rejoined, or dropped with the
            # partitions let go (docs/DELIVERY.md, "Zombies").
            self._doomed = "not a member of the consumer group now (its session expired)"
            return False
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                # Two steps of STEP_TIMEOUT_S each: the offsets, then EndTxn.
                with self.calls.call("commit_transaction", STEP_TIMEOUT_S * 2 + 5):
                    self.producer.commit_transaction(offsets, metadata, STEP_TIMEOUT_S)
                self.metrics.transaction_seconds.labels(self.pipeline).observe(time.monotonic() - began)
            except TransactionError as exc:
                if exc.fatal:
                    # Aborting is the new producer's init_transactions(): _abort renews.
                    self._doomed, self._renew_for = exc.reason, exc
                    return False
                if exc.retriable and not exc.abortable and attempt < COMMIT_ATTEMPTS:
                    log.warning("transaction commit failed (attempt %d), retrying: %s", attempt, exc.reason)
                    continue
                self._doomed = exc.reason
                return False
            break
        self._committed.update(offsets)
        self.tracker.committed(offsets)
        self.progress.ok(COMMIT, time.monotonic())
        self.metrics.commits.labels(self.pipeline, "ok").inc()
        self.stats.count("commits")
        self._open.clear()
        return self._begin()

    def _abort(self, letting_go: Sequence[TopicPartition]) -> None:
        reason, self._doomed = self._doomed or "the transaction could not commit in time", None
        going = set(letting_go)
        dropped = [key for key in self._open if key[0] in going]
        log.warning(
            "transaction aborted (%s): %d outcome records are produced again in the next one%s",
            reason, len(self._open) - len(dropped),
            f", {len(dropped)} of partitions being let go are left to their next owner" if dropped else "",
        )
        self.metrics.commits.labels(self.pipeline, "aborted").inc()
        self.progress.failed(COMMIT)
        self.progress.aborted(owed=len(self._open) > len(dropped))  # what is sent again waits on
        self.stats.count("aborts")
        failed, self._renew_for = self._renew_for, None
        if failed is None:
            self._aborting = True
            try:
                failed = self._abort_call()
            finally:
                self._aborting = False
        for key in dropped:
            del self._open[key]
        self._order.forget(letting_go)
        if failed is not None:
            self._renew(failed)  # a new producer starts a new transaction and resends
            return
        if not self._begin():
            return
        self._resend()

    def _abort_call(self) -> TransactionError | None:
        """Abort; a retriable failure (the coordinator away) is tried again, ABORT_ATTEMPTS
        times at most (retriable for ever is a producer only a new one gets out of), or
        until a stop. Returns the error that ended the attempts, or None."""
        for attempt in range(1, ABORT_ATTEMPTS + 1):
            try:
                with self.calls.call("abort_transaction", STEP_TIMEOUT_S + FLUSH_TIMEOUT_S + 5):
                    self.producer.abort_transaction(STEP_TIMEOUT_S)
                    self.producer.flush(FLUSH_TIMEOUT_S)  # the purged records' reports, ignored
                return None
            except TransactionError as exc:
                if not exc.retriable or exc.fatal or self.lifecycle.stopping or attempt == ABORT_ATTEMPTS:
                    return exc
                log.warning("transaction abort failed, trying again: %s", exc.reason)
                self.sleep(RETRY_PAUSE_S)

    def _resend(self) -> None:
        for send in list(self._open.values()):
            send()

    def _begin(self) -> bool:
        try:
            self.producer.begin_transaction()
        except TransactionError as exc:
            self._renew(exc)
            return False
        return True

    def _renew(self, why: TransactionError) -> None:
        """The producer cannot go on (docs/DELIVERY.md, item 6): a new one with the same
        transactional.id, initialised once the cluster answers (another new one if that
        one fails for good too), its first transaction holding the old one's records."""
        now = time.monotonic()
        self._renewals = [t for t in self._renewals if now - t < RENEW_WINDOW_S]
        if len(self._renewals) >= MAX_RENEWALS or self.lifecycle.stopping:
            self._fatal(why)
            return
        self._renewals.append(now)
        log.warning("transactional producer cannot go on (%s): a new one with the same transactional.id takes "
                    "over, the open transaction's %d records go into its first", why.reason, len(self._open))
        self.metrics.commits.labels(self.pipeline, "renewed").inc()
        self._aborting, broken = True, 0  # the old client's reports, if any come, are for records resent below
        try:
            self.producer.renew()
            while True:
                try:
                    with self.calls.call("init_transactions", RENEW_STEP_TIMEOUT_S + 5):
                        self.producer.init_transactions(RENEW_STEP_TIMEOUT_S)
                    break
                except TransactionError as exc:
                    broken += exc.fatal
                    if self.lifecycle.stopping or broken > MAX_RENEWALS:
                        self._fatal(exc)
                        return
                    log.warning("new transactional producer waits for the cluster: %s", exc.reason)
                    if exc.fatal:
                        self.producer.renew()
                    self.sleep(RETRY_PAUSE_S)
        finally:
            self._aborting = False
        log.info("new transactional producer ready after %.1f s", time.monotonic() - now)
        if not self._reconcile():
            return
        if self._begin():
            self._resend()

    def _reconcile(self) -> bool:
        """The old producer's last transaction is settled now (the new epoch fenced it):
        committed (a commit that reached the coordinator before its call was given up)
        or aborted. The group's committed offsets, which commit with the records, tell
        which: records below them are not produced again. False: stopped meanwhile."""
        source = self._source()
        tps = sorted({key[0] for key in self._open})
        if source is None or not tps:
            return True
        while True:
            try:
                committed = source.committed(tps, STEP_TIMEOUT_S)
                break
            except Exception as exc:  # noqa: BLE001 - any client error: ask again
                if self.lifecycle.stopping:
                    self._fatal(TransactionError(f"reading the committed offsets: {exc}", fatal=True))
                    return False
                log.warning("committed offsets not readable yet, asking again: %s", exc)
                self.sleep(RETRY_PAUSE_S)
        settled = [key for key in self._open if key[1] < committed.get(key[0], -1)]
        for key in settled:
            del self._open[key]
        moved = {tp: o for tp, o in committed.items() if o > self._committed.get(tp, -1)}
        if settled:
            log.warning("the old producer's last transaction had committed: %d records not produced again", len(settled))
            self._committed.update(moved)
            self.tracker.committed(moved)
        return True

    def _fatal(self, exc: TransactionError) -> None:
        self._dead = True
        self.metrics.commits.labels(self.pipeline, "error").inc()
        self.fail(f"transactional producer failed for good ({exc.reason}); nothing more is committed")

    # ------------------------------------------------------------------ rebalances
    def forget(self, tps: Sequence[TopicPartition]) -> None:
        """Partitions let go (after commit(letting_go=tps)): their later outcomes are dropped."""
        self._order.forget(tps)
        for tp in tps:
            self._committed.pop(tp, None)
