"""Topic-range input of `tidebatch etl`: read partitions between two offsets or two
record times, with partitions assigned explicitly (no consumer group membership, no
commits), in chunks of consecutive offsets.

Broker facts this relies on (docs/BROKERS.md, "The embedded broker"; also measured for
this module):
- The end of a partition is the *fetch* high watermark (`get_watermark_offsets(
  cached=True)` after a fetch, or the partition-EOF event): ListOffsets "latest" is
  wrong on the embedded broker.
- `offsets_for_times` is only a hint: on the embedded broker it answers the first
  offset of the log (measured: 0 for every timestamp). So a time range is always
  enforced by filtering each record's timestamp; the broker's answer is used to skip
  ahead at the start (it is never past the true first offset) and, on Apache Kafka
  only, to stop early at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

from consumers.acl_refusals import not_visible, read_refused
from consumers.records import headers_to_dict
from pipeline.codecs.base import Codec, Decoded, decode_all
from pipeline.delivery.outcomes import decode_reason
from pipeline.errors import UserError
from pipeline.etl.features import features_from_requests
from pipeline.etl.inputs import Chunk, Features, Reject
from pipeline.kafka_backend import ConsumerClient, range_reader

_POLL_RECORDS = 5000
_POLL_S = 0.2
_STALL_S = 30.0  # no record and no EOF for this long: the broker is not serving the range
_RESET_BACKOFF_S = 0.5  # before asking again for an offset the broker called out of range

# What the decoded records of a chunk become, the chunk's payload:
# (decoded, offsets, keys, record timestamps, values) -> ctr_features, or
# pipeline/etl/requests.py Requests.of for any other pipeline.
Assemble = Callable[[list[Decoded], list[int], list[bytes | None], list[int | None], list[Any]], Any]


def ctr_features(
    decoded: list[Decoded], offsets: list[int], keys: list[bytes | None], stamps: list[int | None], values: list[Any]
) -> Features:
    """The ctr pipeline's payload: model features, each record's key as text."""
    text = [k.decode("utf-8", "replace") if k is not None else None for k in keys]
    return features_from_requests(decoded, offsets, text, stamps, fallback_ts=0)


@dataclass(frozen=True)
class PartitionRange:
    topic: str
    partition: int
    start: int  # first offset (inclusive)
    end: int  # last offset + 1, at most the high watermark when the job was created
    from_ms: int | None = None  # record-time window [from_ms, to_ms)
    to_ms: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _consumer(bootstrap: str, profile: str, settings: Mapping[str, Any] | None) -> ConsumerClient:
    # An offset the broker calls out of range is an error event here (_records and
    # _watermarks ask again), not the profile's silent "earliest": a range job that
    # jumped back to the log's start re-read offsets before its range. Apache Kafka
    # answered OFFSET_OUT_OF_RANGE once for an offset it held (CI, 2026-12-03).
    return range_reader(profile, bootstrap, settings, "tidebatch-etl", out_of_range_is_error=True)


def resolve_ranges(
    bootstrap: str,
    profile: str,
    topic: str,
    partitions: Sequence[int] | None,
    from_offset: int | None,
    to_offset: int | None,
    from_ms: int | None,
    to_ms: int | None,
    *,
    settings: Mapping[str, Any] | None = None,
) -> list[PartitionRange]:
    """Fix the job's offset ranges once, at creation (a resumed job reuses them).
    `settings`: the consumer's `kafka:` settings (KafkaOverrides.client)."""
    c = _consumer(bootstrap, profile, settings)
    try:
        parts = _partitions(c, topic, partitions, bootstrap)
        lows, highs = _watermarks(c, topic, parts)
        starts = _time_hints(c, topic, parts, from_ms) if from_ms is not None else {}
        ends = _time_hints(c, topic, parts, to_ms) if to_ms is not None and profile != "embedded" else {}
    finally:
        c.close()
    out = []
    for p in parts:
        start = max(lows[p], from_offset if from_offset is not None else lows[p], starts.get(p, -1))
        end = min(highs[p], to_offset if to_offset is not None else highs[p])
        if p in ends and ends[p] >= 0:
            end = min(end, ends[p])
        out.append(PartitionRange(topic, p, start, max(end, start), from_ms, to_ms))
    return out


def _partitions(c: ConsumerClient, topic: str, wanted: Sequence[int] | None, bootstrap: str) -> list[int]:
    try:
        meta = c.list_topics(timeout=10)  # no topic argument: that would create it on Tansu
    except KafkaException as exc:
        raise UserError(f"cannot read Kafka metadata from {bootstrap}: {exc.args[0]}") from None
    if topic not in meta.topics or meta.topics[topic].error is not None:
        raise UserError(not_visible(topic, bootstrap))
    have = sorted(meta.topics[topic].partitions)
    if wanted is None:
        return have
    missing = [p for p in wanted if p not in have]
    if missing:
        raise UserError(f"topic {topic!r} has no partition {missing[0]} (partitions: {have})")
    return sorted(set(wanted))


def _watermarks(c: ConsumerClient, topic: str, parts: list[int]) -> tuple[dict[int, int], dict[int, int]]:
    """Low and high watermarks from a real fetch: one record or the EOF event per
    partition, then the watermarks librdkafka cached from that fetch response."""
    at = dict.fromkeys(parts, 0)
    c.assign([TopicPartition(topic, p, at[p]) for p in parts])
    seen: set[int] = set()
    deadline = time.monotonic() + _STALL_S
    while len(seen) < len(parts):
        if time.monotonic() > deadline:
            raise UserError(f"topic {topic!r}: the broker did not answer a fetch within {_STALL_S:.0f} s")
        for m in c.consume(_POLL_RECORDS, _POLL_S):
            err = m.error()
            if err is not None and err.code() == KafkaError._AUTO_OFFSET_RESET:
                # offset 0 is gone (retention): start from the log's start instead
                at[m.partition()] = OFFSET_BEGINNING
                c.assign([TopicPartition(topic, p, at[p]) for p in parts])
                continue
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                raise_if_refused(err, topic)
                if err.fatal():
                    raise UserError(f"topic {topic!r}: {err.str()}")
                continue
            seen.add(m.partition())
    lows, highs = {}, {}
    for p in parts:
        low, high = c.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        lows[p], highs[p] = max(low, 0), max(high, 0)
    c.unassign()
    return lows, highs


def raise_if_refused(err: KafkaError, topic: str) -> None:
    """A fetch the broker refused for want of an ACL: one line now. librdkafka reports
    it as a non-fatal consumer error and keeps refetching, so skipping it (as the
    transient errors are) waited out _STALL_S and blamed a silent broker (issue 44)."""
    line = read_refused(err.code(), topic)
    if line is not None:
        raise UserError(line)


def _time_hints(c: ConsumerClient, topic: str, parts: list[int], ms: int) -> dict[int, int]:
    found = c.offsets_for_times([TopicPartition(topic, p, ms) for p in parts], timeout=10)
    return {tp.partition: (tp.offset if tp.offset >= 0 and tp.offset != OFFSET_END else -1) for tp in found}


def read_partition_chunks(
    bootstrap: str,
    profile: str,
    rng: PartitionRange,
    chunk_records: int,
    resume_at: int,
    codec: Codec,
    *,
    settings: Mapping[str, Any] | None = None,
    assemble: Assemble = ctr_features,
) -> Iterator[Chunk]:
    """Chunks of offsets [start + k*chunk_records, ...) from `resume_at` (a chunk
    boundary) to the range end; records outside the time window are left out. Each
    record is decoded by `codec` as the worker decodes it; `assemble` makes the
    chunk's payload of the decoded ones."""
    if resume_at >= rng.end:
        return
    c = _consumer(bootstrap, profile, settings)
    try:
        c.assign([TopicPartition(rng.topic, rng.partition, resume_at)])
        index = (resume_at - rng.start) // chunk_records
        batch: list[Any] = []
        for msg in _records(c, rng, resume_at):
            k = (msg.offset() - rng.start) // chunk_records
            if k != index:
                yield _chunk(rng, index, chunk_records, batch, codec, assemble)
                index, batch = k, []
            batch.append(msg)
        yield _chunk(rng, index, chunk_records, batch, codec, assemble)
    finally:
        c.close()


def _records(
    c: ConsumerClient,
    rng: PartitionRange,
    at: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Any]:
    """Messages of the partition from `at` up to the range end (or the EOF). _STALL_S
    without a record ends it with one line, whether the polls came back empty or full
    of errors: a log whose start had passed `at` answered every fetch "out of range",
    and the read, which looked for empty polls only, went on for the whole CI timeout."""
    last_progress = clock()
    position = at
    out_of_range = False
    while position < rng.end:
        for m in c.consume(_POLL_RECORDS, _POLL_S):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return  # the log ends before the range did (e.g. records were deleted)
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    # Out of range by the broker's word: ask for the same offset again
                    # (the range was inside the watermarks when the job was made; a
                    # broker has answered so once for an offset it held) until
                    # _STALL_S without progress says the broker will not serve it.
                    out_of_range = True
                    sleep(_RESET_BACKOFF_S)
                    c.assign([TopicPartition(rng.topic, rng.partition, position)])
                    continue
                raise_if_refused(err, rng.topic)
                if err.fatal():
                    raise UserError(f"{rng.topic}[{rng.partition}]: {err.str()}")
                continue
            if m.offset() < position:
                continue  # never a record before the one asked for
            out_of_range = False
            position = m.offset() + 1
            if m.offset() >= rng.end:
                return
            yield m
            last_progress = clock()  # after the caller's turn: its time is not the broker's
        if clock() - last_progress > _STALL_S:
            if out_of_range:
                raise UserError(
                    f"{rng.topic}[{rng.partition}]: offset {position} out of range for {_STALL_S:.0f} s: the broker "
                    f"no longer holds it (deleted by retention.ms or a delete-records?); range ends at {rng.end}"
                )
            raise UserError(
                f"{rng.topic}[{rng.partition}]: no records at offset {position} for {_STALL_S:.0f} s "
                f"(range ends at {rng.end})"
            )


def _chunk(rng: PartitionRange, index: int, size: int, msgs: list[Any], codec: Codec, assemble: Assemble) -> Chunk:
    first = rng.start + index * size
    kept = []
    for m in msgs:
        ts_type, ts = m.timestamp()
        ts = ts if ts_type != 0 and ts >= 0 else None
        if _in_window(ts, rng):
            kept.append((m, ts))
    outcomes = decode_all(codec, [(m.value(), headers_to_dict(m.headers())) for m, _ in kept])
    ok: list[Decoded] = []
    offsets, keys, stamps, values = [], [], [], []
    rejects: list[Reject] = []
    for (m, ts), decoded in zip(kept, outcomes, strict=True):
        value = m.value()
        text = value.decode("utf-8", "replace")[:1000] if value else None
        if isinstance(decoded, Exception):  # the reason the worker's dead letter gives
            rejects.append(Reject(m.offset(), decode_reason(decoded), text))
            continue
        ok.append(decoded)
        offsets.append(m.offset())
        keys.append(m.key())
        stamps.append(ts)
        values.append(text)
    payload = assemble(ok, offsets, keys, stamps, values)
    nxt = min(first + size, rng.end)
    span = max(rng.end - rng.start, 1)
    return Chunk(index, first, nxt, len(ok) + len(rejects), payload, rejects, (nxt - rng.start) / span)


def _in_window(ts: int | None, rng: PartitionRange) -> bool:
    if rng.from_ms is None and rng.to_ms is None:
        return True
    if ts is None:
        return False
    return (rng.from_ms is None or ts >= rng.from_ms) and (rng.to_ms is None or ts < rng.to_ms)
