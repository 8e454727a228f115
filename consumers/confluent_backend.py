"""confluent-kafka (librdkafka) source and producer: the default, fast backend.

Threading: the source is used by the worker's source thread only. The producer's
produce() is called from executor threads too (it is thread-safe); delivery callbacks
run in whichever thread calls poll()/flush(), which is the source thread, except during
shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
)
from confluent_kafka import TopicPartition as CkTopicPartition

from consumers.broker_connections import STATS_INTERVAL_MS
from consumers.client_logs import shared_log
from consumers.kafka_failures import REFUSED_ACCESS, classify, failure_line
from consumers.records import (
    AckCallback,
    CommitCallback,
    KafkaRefused,
    SendError,
    SourceRecord,
    TopicPartition,
    TransactionError,
    headers_to_dict,
)

log = logging.getLogger(__name__)

RebalanceCallback = Callable[[list[TopicPartition]], None]


class ConfluentSource:
    def __init__(
        self,
        config: Mapping[str, object],
        topics: list[str],
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_stats: Callable[[str], None] | None = None,
    ) -> None:
        """on_stats: gets librdkafka's statistics JSON every STATS_INTERVAL_MS (unless
        the config sets its own interval), from this consumer's poll."""
        self._commit_callbacks: deque[CommitCallback] = deque()
        stats = {} if on_stats is None else {
            "statistics.interval.ms": config.get("statistics.interval.ms", STATS_INTERVAL_MS), "stats_cb": on_stats}
        self._consumer = Consumer({**config, **stats, "on_commit": self._committed})
        self._bootstrap = str(config.get("bootstrap.servers", "?"))
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._paused = False
        # Partitions let go by a rebalance callback during the current poll_batch() call
        # (and not assigned again in it): their records in that call's result are stale.
        self._let_go: set[TopicPartition] = set()
        self._consumer.subscribe(
            topics, on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
        )

    # Rebalance callbacks run inside poll()/consume(), in the source thread.
    def _assigned(self, consumer: Consumer, parts: list[CkTopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in parts]
        self._let_go.difference_update(tps)
        if self._paused and parts:
            # Partitions handed over during backpressure must start paused too.
            consumer.pause(parts)
        self._on_assign(tps)

    def _revoked(self, consumer: Consumer, parts: list[CkTopicPartition]) -> None:
        tps = [(p.topic, p.partition) for p in parts]
        self._let_go.update(tps)
        self._on_revoke(tps)

    def poll_batch(self, max_records: int, timeout: float) -> list[SourceRecord]:
        """Up to max_records, returning as soon as any are there. consume(n, timeout)
        alone waits the whole timeout unless n arrive: at low rates that wait would be
        added to every request's latency."""
        self._let_go = set()
        msgs = self._consumer.consume(num_messages=max_records, timeout=0)
        if not msgs:
            first = self._consumer.poll(timeout)
            if first is None:
                return []
            msgs = [first, *self._consumer.consume(num_messages=max_records - 1, timeout=0)]
        if self._let_go:
            msgs = self._without_let_go(msgs)
        out: list[SourceRecord] = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                # A fatal error arrives as an event with code _FATAL whose own fatal()
                # is False (the real error is the client's fatal error); either way
                # the consumer is dead for good -- e.g. a KIP-848 static member
                # restarted before its crashed predecessor's session timed out
                # (UNRELEASED_INSTANCE_ID) -- so the worker must exit, not idle.
                if err.fatal() or err.code() == KafkaError._FATAL:
                    raise KafkaException(err)
                self._consumer_error(err)
                continue
            ts_type, ts = m.timestamp()
            out.append(
                SourceRecord(
                    topic=m.topic(),
                    partition=m.partition(),
                    offset=m.offset(),
                    key=m.key(),
                    value=m.value(),
                    headers=headers_to_dict(m.headers()),
                    timestamp_ms=ts if ts_type != 0 and ts >= 0 else None,
                    log_append_time=ts_type == TIMESTAMP_LOG_APPEND_TIME,
                )
            )
        return out

    def _without_let_go(self, msgs: list[Message]) -> list[Message]:
        """librdkafka serves a rebalance callback in the middle of consume() and still
        returns the messages it had taken off the queue before it (rd_kafka_q_serve_rkmessages
        purges them only if the fetcher's barrier arrives within the same call). Those of a
        partition the callback let go are stale: the worker has forgotten the partition,
        its next owner reads them from the committed offset, and taking them in would
        score them twice (a zombie's lost partitions after it wakes: with exactly_once, a
        second committed result once it has rejoined the group)."""
        kept = [m for m in msgs if (m.topic(), m.partition()) not in self._let_go]
        if len(kept) < len(msgs):
            log.info("dropped %d records of partitions let go during this poll: their next owner reads them",
                     len(msgs) - len(kept))
        return kept

    def _consumer_error(self, err: KafkaError) -> None:
        """A missing ACL (topic or group authorization) stops the worker with one line:
        the broker refuses every retry alike, and a worker idling on it looks like one
        with nothing to do. Anything else is logged, rate-limited: librdkafka repeats
        the same error on every metadata refresh."""
        failure = classify(err.name(), err.str(), self._bootstrap)
        if failure is not None and failure.kind in REFUSED_ACCESS:
            raise KafkaRefused(failure.line)
        shared_log().emit(logging.WARNING, f"consumer error: {err.str()}")

    def commit(self, offsets: Mapping[TopicPartition, int], on_done: CommitCallback | None = None) -> None:
        """Commit `offsets`. Without `on_done`: synchronously, raising on failure (revoke,
        shutdown). With it: asynchronously; `on_done(None or the error)` runs in the
        source thread inside a later poll. A synchronous commit waits for the offsets
        to be replicated to every in-sync replica of __consumer_offsets, and after a
        broker dies that is until it is fenced (seconds): the source loop stood still
        meanwhile, serving neither polls nor delivery reports."""
        if not offsets:
            return
        parts = [CkTopicPartition(t, p, o) for (t, p), o in offsets.items()]
        if on_done is None:
            self._consumer.commit(offsets=parts, asynchronous=False)
            return
        self._commit_callbacks.append(on_done)
        try:
            self._consumer.commit(offsets=parts, asynchronous=True)
        except KafkaException as exc:
            self._commit_callbacks.pop()
            on_done(exc)

    def _committed(self, err: KafkaError | None, _parts: list[CkTopicPartition]) -> None:
        # librdkafka answers commits in the order they were sent; a synchronous commit
        # may report here too, with no callback waiting for it.
        if self._commit_callbacks:
            self._commit_callbacks.popleft()(None if err is None else KafkaException(err))

    def assignment(self) -> list[TopicPartition]:
        return [(p.topic, p.partition) for p in self._consumer.assignment()]

    def pause_all(self) -> None:
        self._paused = True
        parts = self._consumer.assignment()
        if parts:
            self._consumer.pause(parts)

    def resume_all(self) -> None:
        self._paused = False
        parts = self._consumer.assignment()
        if parts:
            self._consumer.resume(parts)

    @property
    def paused(self) -> bool:
        return self._paused

    def lag(self) -> dict[TopicPartition, int]:
        """High watermark from the last fetch (cached) minus our position. Never the
        ListOffsets "latest" answer, which is wrong on the embedded broker. While
        backpressure merely holds intake the cache can lag behind too (a full prefetch
        queue stops fetching), but asking the broker blocks the source thread for a
        round trip per partition, so only a paused source asks."""
        out: dict[TopicPartition, int] = {}
        parts = self._consumer.assignment()
        if not parts:
            return out
        for p in self._consumer.position(parts):
            _, high = self._consumer.get_watermark_offsets(p, cached=True)
            if self._paused:
                # A paused partition is not fetched, so its cached watermark is frozen
                # exactly when lag matters (backpressure): ask the broker. On the
                # embedded broker this answer is a little short (docs/BROKERS.md), never more.
                with contextlib.suppress(KafkaException):
                    _, queried = self._consumer.get_watermark_offsets(p, timeout=1.0, cached=False)
                    high = max(high if high is not None else -1, queried)
            if high is None or high < 0 or p.offset < 0:
                continue
            out[(p.topic, p.partition)] = max(high - p.offset, 0)
        return out

    def group_metadata(self) -> object:
        return self._consumer.consumer_group_metadata()

    def in_group(self) -> bool:
        # librdkafka resets the member id to "" when the coordinator answers that it
        # does not know it (the session expired), until the group is joined again.
        return bool(self._consumer.memberid())

    def committed(self, tps: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
        # librdkafka asks with require_stable: an offset of a transaction still being
        # completed is waited for, never returned half done.
        got = self._consumer.committed([CkTopicPartition(t, p) for t, p in tps], timeout=timeout)
        return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0 and tp.error is None}

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """The next login uses these (consumers/credential_refresh.py)."""
        self._consumer.set_sasl_credentials(username, password)

    def close(self) -> None:
        self._consumer.close()


# Errors that are about the record itself: sending it again cannot succeed.
_REFUSED_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,  # over message.max.bytes (local) or the topic's max.message.bytes
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
    }
)
# librdkafka's default message.max.bytes.
_DEFAULT_MAX_RECORD_BYTES = 1_000_000


def _send_error(err: KafkaError, topic: str, bootstrap: str) -> SendError:
    failure = classify(err.name(), err.str(), bootstrap)
    if failure is not None and failure.kind in REFUSED_ACCESS:
        # The broker refuses every retry alike until an operator grants the ACL.
        return SendError(failure_line(failure.kind, bootstrap, f"writing to {topic}: {err.str()}"), forbidden=True)
    return SendError(err.str(), refused=err.code() in _REFUSED_CODES)


class ConfluentProducer:
    def __init__(self, config: Mapping[str, object]) -> None:
        self._config = dict(config)
        self._producer = Producer(self._config)
        self._bootstrap = str(config.get("bootstrap.servers", ""))
        # The largest record this producer accepts (librdkafka counts key + value +
        # headers + a few bytes of framing against it).
        self.max_record_bytes = int(config.get("message.max.bytes", _DEFAULT_MAX_RECORD_BYTES))  # type: ignore[call-overload]

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        on_ack: AckCallback,
    ) -> None:
        """Produce one record; `on_ack` gets exactly one call, with None or the error.
        A record librdkafka refuses at once (too large, say) is reported through
        `on_ack` like a failed delivery, never raised: the caller decides what the
        request's outcome becomes instead."""

        def delivered(err: KafkaError | None, _msg: object) -> None:
            on_ack(None if err is None else _send_error(err, topic, self._bootstrap))

        while True:
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=delivered)
                return
            except BufferError:
                # Local queue full: serve delivery reports to make room, then retry.
                self._producer.poll(0.05)
            except KafkaException as exc:
                on_ack(_send_error(exc.args[0], topic, self._bootstrap))
                return

    def poll(self, timeout: float = 0.0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float) -> int:
        """Block until every record is acked or timeout; returns how many are left."""
        return self._producer.flush(timeout)

    def __len__(self) -> int:
        return len(self._producer)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """The next login uses these (consumers/credential_refresh.py)."""
        self._producer.set_sasl_credentials(username, password)


def _transaction_error(step: str, exc: KafkaException) -> TransactionError:
    """librdkafka's own classification of a failed transaction step: retriable (call it
    again), txn_requires_abort (abort, then produce again), fatal (the producer is
    fenced or broken for good)."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is None:
        return TransactionError(f"{step}: {exc}", fatal=True)
    return TransactionError(
        f"{step}: {err.str()}",
        retriable=err.retriable(),
        abortable=err.txn_requires_abort(),
        fatal=err.fatal(),
    )


class _StepThread:
    """One daemon thread running calls in turn: a call stuck in librdkafka must hold
    neither the caller nor the interpreter's exit (a ThreadPoolExecutor's threads are
    joined at exit)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], object], Future] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="txn-step", daemon=True).start()

    def submit(self, call: Callable[[], object]) -> Future:
        future: Future = Future()
        self._calls.put((call, future))
        return future

    def close(self) -> None:
        self._calls.put(None)  # ends the thread once its current call returns

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)


class ConfluentTransactionalProducer(ConfluentProducer):
    """A ConfluentProducer with a transactional.id in its config: its records are
    visible to read_committed readers only once commit_transaction() returns.

    Each transaction step runs in a helper thread that the caller waits for at most the
    step's timeout plus CALL_MARGIN_S: librdkafka does not always keep the timeout it is
    given (a worker whose cluster lost its quorum sat ~600 s in
    send_offsets_to_transaction with 30 s passed, issue 49). A step that overruns is a
    fatal TransactionError: the caller renews the producer (renew()), whose new epoch
    fences whatever the stuck call may still do."""

    CALL_MARGIN_S = 5.0

    def __init__(self, config: Mapping[str, object]) -> None:
        super().__init__(config)
        self._steps = _StepThread()
        self._offsets_in = False  # the open transaction holds its offsets already

    def _step(self, step: str, call: Callable[[], None], timeout: float) -> None:
        future = self._steps.submit(call)
        try:
            future.result(timeout=timeout + self.CALL_MARGIN_S)
        except FutureTimeout:
            raise TransactionError(
                f"{step}: librdkafka did not return within {timeout + self.CALL_MARGIN_S:.0f} s", fatal=True
            ) from None
        except KafkaException as exc:
            raise _transaction_error(step, exc) from exc

    def init_transactions(self, timeout: float) -> None:
        """Fences older producers with this transactional.id and aborts their open
        transaction (a killed predecessor's), so read_committed readers move on."""
        self._step("init_transactions", lambda: self._producer.init_transactions(timeout), timeout)

    def begin_transaction(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise _transaction_error("begin_transaction", exc) from exc
        self._offsets_in = False

    def commit_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout: float
    ) -> None:
        parts = [CkTopicPartition(t, p, o) for (t, p), o in offsets.items()]
        producer = self._producer
        # A commit that timed out is resumed by calling commit_transaction again, not by
        # sending the offsets again: librdkafka refuses that ("Conflicting
        # commit_transaction API call is already in progress"), and so every abort after.
        if parts and not self._offsets_in:
            self._step("send_offsets_to_transaction",
                       lambda: producer.send_offsets_to_transaction(parts, group_metadata, timeout), timeout)
            self._offsets_in = True
        self._step("commit_transaction", lambda: producer.commit_transaction(timeout), timeout)

    def abort_transaction(self, timeout: float) -> None:
        """Purges the records still queued (their delivery reports fail) and has the
        coordinator write abort markers: read_committed readers skip every record."""
        self._step("abort_transaction", lambda: self._producer.abort_transaction(timeout), timeout)
        self._offsets_in = False

    def renew(self) -> None:
        """A new librdkafka producer with the same settings (transactional.id too): its
        init_transactions() bumps the epoch past the old one's and has the coordinator
        abort the old one's open transaction. The old one's queued records are purged
        and its delivery reports never served: the caller produces again what it needs."""
        old, self._producer = self._producer, Producer(self._config)
        self._offsets_in = False
        with contextlib.suppress(KafkaException, RuntimeError):
            old.purge(in_queue=True, in_flight=True, blocking=False)
        # A step still stuck in the old client keeps its helper thread: new steps get a
        # new one (the stuck call returns, fenced, whenever librdkafka lets it).
        self._steps.close()
        self._steps = _StepThread()
