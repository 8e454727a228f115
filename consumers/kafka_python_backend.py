"""kafka-python source and producer: the pure-Python backend (`client: kafka-python`),
for platforms without librdkafka wheels. Same contract as consumers/confluent_backend.py
(same delivery guarantees, offset tracking, pause/resume and DLQ in the worker), slower
per record: a worker drains at about half the confluent client's rate with it (README.md).
Install `crc32c` with it: 4-5x faster record checks.

Threading differs from librdkafka: kafka-python runs delivery callbacks in its own
sender thread, so `poll()` has nothing to serve; the offset tracker is thread-safe.
kafka-python 3 also calls rebalance listeners on its IO thread, where a synchronous
commit is refused ("Cannot block on net.run() from the IO thread itself"): the source
queues the rebalance there and hands it to the worker from poll_batch(), in the
source thread, as librdkafka does (see `_Listener`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka import errors as kafka_errors
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KpTopicPartition

from consumers.records import AckCallback, SendError, SourceRecord, TopicPartition, headers_to_dict

log = logging.getLogger(__name__)

RebalanceCallback = Callable[[list[TopicPartition]], None]

# ConsumerRecord.timestamp_type of a broker-set timestamp (topic config
# message.timestamp.type=LogAppendTime); 0 is the producer's CreateTime. kafka-python
# names it only on its record classes (DefaultRecordBase.LOG_APPEND_TIME).
LOG_APPEND_TIME = 1
# The longest one poll_batch() waits for a group join to finish (see _finish_join):
# a join waits for every member to rejoin, seconds when they heartbeat every 3 s.
_JOIN_WAIT_MS = 30_000
# A join in progress this long (no member's revoke waits more than 10 s) is stuck.
_STUCK_JOIN_S = 20.0


class _Listener(ConsumerRebalanceListener):
    """Runs on kafka-python's IO thread: only notes what changed. The worker's revoke
    (finish the partitions' work, commit it) then runs in the source thread right
    after poll() returns, before the next poll() lets the group move on: the next
    owner cannot get the partitions until this member rejoins, so the commit still
    lands first, as the Java consumer's onPartitionsRevoked would."""

    def __init__(self, source: KafkaPythonSource) -> None:
        self._source = source

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._source._note("revoke", list(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        parts = list(assigned)
        if self._source.paused and parts:
            # Handed over during backpressure: start paused, before any fetch.
            self._source._consumer.pause(*parts)
        self._source._note("assign", parts)


class KafkaPythonSource:
    def __init__(
        self,
        config: Mapping[str, Any],
        topics: list[str],
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        consumer_factory: Callable[..., Any] = KafkaConsumer,
    ) -> None:
        self._consumer = consumer_factory(**dict(config))
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._paused = False
        self._events: list[tuple[str, list[TopicPartition]]] = []
        self._events_lock = threading.Lock()
        self._rebalancing_since: float | None = None
        self._consumer.subscribe(topics=topics, listener=_Listener(self))
        # Know the topics' partitions before joining. kafka-python 3 joins the group
        # without waiting for the subscription's metadata (it waits only for patterns,
        # coordinator/consumer.py, KAFKA-3949): a leader whose metadata arrived after
        # it assigned gave its group nothing and never rejoined, 1-2 times in 25 under
        # CPU load (bench/kafka_python_join.py). After subscribe(), so that the fetch
        # also sets the coordinator's metadata snapshot: fetched before, the snapshot
        # stayed empty until the first assignment's own refresh, which then differed
        # and started a second join at once (where the stuck joins were seen). One
        # fetch: a topic that does not exist yet is not found, and the subscription
        # retries as before.
        for topic in topics:
            self._consumer.partitions_for_topic(topic)

    def _finish_join(self) -> None:
        """Wait for a group (re)join in one call. kafka-python 3.0.12 drops a JoinGroup +
        SyncGroup that completes after the poll() waiting on it gave up, and starts a
        new join (coordinator/base.py join_group_async: a done join task is replaced,
        its result unread). The worker polls every 20 ms: under load the round trip
        took longer, every time, and the group never settled, commits failing with
        RebalanceInProgressError (seen in CI). The wait ends once joined; the source
        loop stalls only while the group rebalances, as a Java consumer's poll() does."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        if coordinator is None:
            return
        self._unstick_join(coordinator)
        if coordinator.need_rejoin():
            coordinator.poll(timeout_ms=_JOIN_WAIT_MS)

    def _unstick_join(self, coordinator: Any) -> None:
        """Start the join again when one has gone nowhere for _STUCK_JOIN_S. Under CPU
        load kafka-python 3.0.12 sometimes leaves a member mid-join for good (state
        REBALANCING, its join task never completing, no new join asked for): commits
        failed for minutes, until the next member's join pushed this one out of the
        group (seen in CI). A fresh JoinGroup from the same member completes the round."""
        if not coordinator.rebalance_in_progress():
            self._rebalancing_since = None
            return
        now = time.monotonic()
        if self._rebalancing_since is None:
            self._rebalancing_since = now
        elif now - self._rebalancing_since >= _STUCK_JOIN_S:
            log.warning("kafka-python group join stuck for %.0f s: joining again", now - self._rebalancing_since)
            self._rebalancing_since = now
            coordinator._join_task = None  # the stuck one's result would be dropped anyway
            coordinator.request_rejoin()

    def _note(self, kind: str, parts: list[KpTopicPartition]) -> None:
        with self._events_lock:
            self._events.append((kind, [(p.topic, p.partition) for p in parts]))

    def _deliver_rebalances(self) -> set[TopicPartition]:
        """Hand the rebalances noted during poll() to the worker, in order; returns
        the partitions revoked and not assigned again."""
        with self._events_lock:
            events, self._events = self._events, []
        gone: set[TopicPartition] = set()
        for kind, tps in events:
            if kind == "revoke":
                gone.update(tps)
                if tps:
                    self._on_revoke(tps)
            else:
                gone.difference_update(tps)
                self._on_assign(tps)
        return gone

    def poll_batch(self, max_records: int, timeout: float) -> list[SourceRecord]:
        self._finish_join()
        # A revoke of that join is committed before poll() may start the follow-up join
        # that gives the partitions to their next owner.
        gone = self._deliver_rebalances()
        batches = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        gone |= self._deliver_rebalances()
        out: list[SourceRecord] = []
        for tp, records in batches.items():
            if (tp.topic, tp.partition) in gone:
                continue  # fetched before the revoke: the next owner reads them
            for r in records:
                out.append(
                    SourceRecord(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=r.offset,
                        key=r.key,
                        value=r.value,
                        headers=headers_to_dict(r.headers),
                        timestamp_ms=r.timestamp if r.timestamp is not None and r.timestamp >= 0 else None,
                        log_append_time=r.timestamp_type == LOG_APPEND_TIME,
                    )
                )
        return out

    def commit(
        self, offsets: Mapping[TopicPartition, int], on_done: Callable[[Exception | None], None] | None = None
    ) -> None:
        """As ConfluentSource.commit: synchronous without `on_done`, else asynchronous
        with `on_done(None or the error)` called from a later poll."""
        if not offsets:
            return
        parts = {KpTopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        if on_done is None:
            try:
                self._consumer.commit(parts)
            except kafka_errors.RebalanceInProgressError:
                # kafka-python moves a join on only inside poll(): a worker stopping
                # mid-rebalance (it no longer polls) finishes the join, then commits.
                self._finish_join()
                self._consumer.commit(parts)
            return

        def done(_offsets: Any, response: Any) -> None:
            on_done(response if isinstance(response, Exception) else None)

        self._consumer.commit_async(parts, callback=done)

    def assignment(self) -> list[TopicPartition]:
        return [(p.topic, p.partition) for p in self._consumer.assignment()]

    def pause_all(self) -> None:
        self._paused = True
        parts = list(self._consumer.assignment())
        if parts:
            self._consumer.pause(*parts)

    def resume_all(self) -> None:
        self._paused = False
        parts = list(self._consumer.assignment())
        if parts:
            self._consumer.resume(*parts)

    @property
    def paused(self) -> bool:
        return self._paused

    def lag(self) -> dict[TopicPartition, int]:
        """highwater() is the high watermark from the last fetch response, like
        librdkafka's cached watermark: right on the embedded broker too. kafka-python
        fetches only inside poll(), which a holding worker still calls (a trickle)."""
        out: dict[TopicPartition, int] = {}
        for p in self._consumer.assignment():
            high = self._consumer.highwater(p)
            if high is None:
                continue
            out[(p.topic, p.partition)] = max(high - self._consumer.position(p), 0)
        return out

    def close(self) -> None:
        self._consumer.close(autocommit=False)


# Errors that are about the record itself: sending it again cannot succeed.
_REFUSED = (
    kafka_errors.MessageSizeTooLargeError,
    kafka_errors.RecordListTooLargeError,
    kafka_errors.InvalidRecordError,
    kafka_errors.CorruptRecordError,
)
# kafka-python's default max_request_size.
_DEFAULT_MAX_RECORD_BYTES = 1_048_576


def _send_error(exc: BaseException) -> SendError:
    # A missing ACL (TopicAuthorizationFailedError): every retry fails alike, stop.
    forbidden = isinstance(exc, kafka_errors.TopicAuthorizationFailedError)
    return SendError(f"{type(exc).__name__}: {exc}", refused=isinstance(exc, _REFUSED), forbidden=forbidden)


class KafkaPythonProducer:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._producer = KafkaProducer(**dict(config))
        self._lock = threading.Lock()
        self._in_flight = 0
        self.max_record_bytes = int(config.get("max_request_size", _DEFAULT_MAX_RECORD_BYTES))

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        on_ack: AckCallback,
    ) -> None:
        """As ConfluentProducer.send: exactly one `on_ack` call, never an exception for
        a record kafka-python refuses before sending it."""
        with self._lock:
            self._in_flight += 1

        def ok(_metadata: Any) -> None:
            self._done()
            on_ack(None)

        def failed(exc: BaseException) -> None:
            self._done()
            on_ack(_send_error(exc))

        try:
            future = self._producer.send(topic, value=value, key=key, headers=headers or None)
        except kafka_errors.KafkaError as exc:  # e.g. MessageSizeTooLargeError, raised at once
            failed(exc)
            return
        future.add_callback(ok)
        future.add_errback(failed)

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def poll(self, timeout: float = 0.0) -> int:
        """Callbacks run in kafka-python's sender thread, so there is nothing to serve;
        but wait like confluent's poll(timeout): the worker's source loop waits here
        while backpressure holds intake (and on revoke), and returning at once made it
        spin on the GIL the executor needs."""
        if timeout > 0:
            time.sleep(timeout)
        return 0

    def flush(self, timeout: float) -> int:
        try:
            self._producer.flush(timeout=timeout)
        except Exception as exc:  # KafkaTimeoutError: report what is left
            log.warning("producer flush: %s", exc)
        return len(self)

    def __len__(self) -> int:
        with self._lock:
            return self._in_flight
