"""kafka-python source and producer: the pure-Python backend (`client: kafka-python`),
for platforms without librdkafka wheels. Same contract as consumers/confluent_backend.py
(same delivery guarantees, offset tracking, pause/resume and DLQ in the worker), 5-20x
slower (../shared/BROKER.md). Install `crc32c` with it: 4-5x faster record checks.

Threading differs from librdkafka: kafka-python runs delivery callbacks in its own
sender thread, so `poll()` has nothing to serve; the offset tracker is thread-safe.
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


class _Listener(ConsumerRebalanceListener):
    def __init__(self, source: KafkaPythonSource) -> None:
        self._source = source

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._source._on_revoke([(p.topic, p.partition) for p in revoked])

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._source._assigned(list(assigned))


class KafkaPythonSource:
    def __init__(
        self,
        config: Mapping[str, Any],
        topics: list[str],
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
    ) -> None:
        self._consumer = KafkaConsumer(**dict(config))
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._paused = False
        self._consumer.subscribe(topics=topics, listener=_Listener(self))

    def _assigned(self, parts: list[KpTopicPartition]) -> None:
        if self._paused and parts:
            self._consumer.pause(*parts)  # handed over during backpressure: start paused
        self._on_assign([(p.topic, p.partition) for p in parts])

    def poll_batch(self, max_records: int, timeout: float) -> list[SourceRecord]:
        batches = self._consumer.poll(timeout_ms=int(timeout * 1000), max_records=max_records)
        out: list[SourceRecord] = []
        for tp, records in batches.items():
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
    return SendError(f"{type(exc).__name__}: {exc}", refused=isinstance(exc, _REFUSED))


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
