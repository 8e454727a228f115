"""Read a topic from its start (or a record time) to the end it had when the read
began, by explicit assignment: no consumer group, nothing committed, so reading a
dead-letter topic never disturbs anyone. The offsets are fixed at the start the way
pipeline/etl/topic.py fixes a job's range (and for the same broker facts), so a
worker still dead-lettering meanwhile does not keep the read going for ever."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline.dlq.letters import DeadLetter
from pipeline.errors import UserError
from pipeline.etl.topic import PartitionRange, raise_if_refused, resolve_ranges
from pipeline.kafka_backend import plain_consumer, range_reader

_POLL_RECORDS = 1000
_POLL_S = 0.2
_STALL_S = 30.0  # no record and no EOF for this long: the broker is not serving the range


def topic_exists(bootstrap: str, profile: str, topic: str, settings: Mapping[str, Any] | None = None) -> bool:
    c = plain_consumer(profile, bootstrap, settings, "tidebatch-dlq")  # never joins: metadata only
    try:
        meta = c.list_topics(timeout=10)  # no topic argument: that would create it on Tansu
    except KafkaException as exc:
        raise UserError(f"cannot read Kafka metadata from {bootstrap}: {exc.args[0]}") from None
    finally:
        c.close()
    return topic in meta.topics and meta.topics[topic].error is None


def read_topic(
    bootstrap: str,
    profile: str,
    topic: str,
    *,
    since_ms: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> Iterator[DeadLetter]:
    """Every record of `topic`, partition by partition in offset order, up to the end
    each partition had when this was called; from `since_ms` (record time) if given.
    `settings`: the consumer's `kafka:` settings (-X)."""
    ranges = resolve_ranges(bootstrap, profile, topic, None, None, None, since_ms, None, settings=settings)
    for rng in ranges:
        if rng.start < rng.end:
            yield from _partition(bootstrap, profile, rng, settings)


def _partition(bootstrap: str, profile: str, rng: PartitionRange, settings: Mapping[str, Any] | None) -> Iterator[DeadLetter]:
    c = range_reader(profile, bootstrap, settings, "tidebatch-dlq")
    try:
        c.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        position, last_progress = rng.start, time.monotonic()
        while position < rng.end:
            msgs = c.consume(_POLL_RECORDS, _POLL_S)
            if not msgs and time.monotonic() - last_progress > _STALL_S:
                raise UserError(f"{rng.topic}[{rng.partition}]: no records at offset {position} for {_STALL_S:.0f} s")
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return  # the log ends before the snapshot did (records deleted)
                    raise_if_refused(err, rng.topic)
                    if err.fatal():
                        raise UserError(f"{rng.topic}[{rng.partition}]: {err.str()}")
                    continue
                last_progress, position = time.monotonic(), m.offset() + 1
                if m.offset() >= rng.end:
                    return
                ts_type, ts = m.timestamp()
                yield DeadLetter(
                    rng.topic, m.partition(), m.offset(), ts if ts_type != 0 and ts >= 0 else None,
                    m.key(), m.value(), list(m.headers() or []),
                )
    finally:
        c.close()
