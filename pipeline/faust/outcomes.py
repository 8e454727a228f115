"""A Faust app's outcome records: each event's result, dead letter or late record, built
by the worker's OutcomeRecords (pipeline/delivery/outcomes.py) -- topics' limits, headers,
values and the reasons dead letters give -- so a record a Faust app writes is the record
the worker writes for the same request and outcome, byte for byte; sent to Faust
topics, each send's delivery future handed back (pipeline/faust/batch.py defer_ack acks
the events once Kafka has them all).

Unlike the worker, a record Kafka refuses is not turned into a dead letter here: its
send's future fails and its events stay unacked (replayed).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection, Sequence
from typing import Any

from consumers.dead_letter import Origin, class_path
from consumers.records import SourceRecord, headers_to_dict
from models.registry import ModelSpec
from pipeline.batching.request import RULE_OVERDUE
from pipeline.delivery.limits import DEAD_LETTER_HEADROOM_BYTES, Limits
from pipeline.delivery.outcomes import OutcomeRecords, Topics, decode_reason
from pipeline.faust.batch import FaustBatch
from pipeline.observe.tracing import TRACE_HEADERS
from pipeline.scoring import BatchTiming, result_document

log = logging.getLogger(__name__)

# Records this path writes must fit aiokafka's max_request_size (1 MiB) and Apache
# Kafka's default max.message.bytes (~1 MB): a dead-letter copy is cut to fit
# (consumers/dead_letter.py), a larger result is its request's dead letter.
FAUST_MAX_RECORD_BYTES = 1_000_000
DEAD_LETTER_PREFIX_BYTES = 65536
FAUST_LIMITS = Limits(
    # Not checked on this path (no entry limit); what resolve_limits would give.
    request_bytes=FAUST_MAX_RECORD_BYTES - DEAD_LETTER_HEADROOM_BYTES,
    topic_bytes={},
    producer_bytes=FAUST_MAX_RECORD_BYTES,
    prefix_bytes=DEAD_LETTER_PREFIX_BYTES,
)


def source_record(event: Any) -> SourceRecord:
    """A Faust event as the client-neutral record the outcome records are built from."""
    m = event.message
    headers = m.headers
    if isinstance(headers, dict):
        headers = list(headers.items())
    ts = m.timestamp
    return SourceRecord(
        topic=m.topic,
        partition=m.partition,
        offset=m.offset,
        key=m.key,
        value=m.value,
        headers=headers_to_dict(headers),
        timestamp_ms=int(round(ts * 1000.0)) if ts else None,
        # log_append_time stays False: Faust's Message.timestamp_type is aiokafka's over
        # Kafka, but its in-memory channel sets 1 for any timestamp a sender gave, so
        # 1 does not reliably mean the broker's append; nothing on this path splits
        # the produce leg off anyway (pipeline/worker/publisher.py does, for the worker).
    )


def topic_name(topic: Any) -> str:
    """A Faust topic's one name ("" for none)."""
    return "" if topic is None else str(topic.get_topic_name())


class FaustOutcomes:
    """The topics one batch's outcomes go to: results to `output`, rejected input and
    refused requests to `dead_letter`, requests routed late to `late` (Faust topics).

    origin: the group, member and codec class that dead letters name. carry_headers:
    the request headers each result carries (the worker's `result_headers`)."""

    def __init__(
        self,
        output: Any,
        *,
        dead_letter: Any = None,
        late: Any = None,
        origin: Origin | None = None,
        carry_headers: Collection[str] = TRACE_HEADERS,
        limits: Limits = FAUST_LIMITS,
    ) -> None:
        self.output = output
        self.dead_letter_topic = dead_letter
        self.late_topic = late
        topics = Topics(topic_name(output), topic_name(dead_letter), topic_name(late))
        self.records = OutcomeRecords(topics, limits, carry_headers=carry_headers, origin=origin)

    async def send_batch(
        self,
        batch: FaustBatch,
        model: ModelSpec,
        results: Sequence[dict | None],
        errors: Sequence[str | None],
        timing: BatchTiming,
    ) -> list[Awaitable[Any]]:
        """One record per event of the batch and per event riding along with it: each
        scored event's result (or its dead letter, when the model refused it -- its
        reason in `errors` -- or the result cannot be published), each rejected event's
        dead letter, each routed-late event's late record. Marks the dead-lettered
        events in `batch.outcomes`; returns the delivery futures."""
        futures: list[Awaitable[Any]] = []
        for i, (item, result, error) in enumerate(zip(batch.items, results, errors, strict=True)):
            rec = source_record(item.event)
            if result is None:
                batch.outcomes[i] = "dlq"
                futures.append(await self.dead_letter(rec, error or "model error", "inference"))
                continue
            doc = result_document(model, item.prepared, rec, result, timing, item.arrival_wall_ms, item.deadline_wall_ms)
            value = self.records.result_value(rec, doc)
            if isinstance(value, str):
                # As the worker: a result Kafka would refuse is this request's dead
                # letter, never an error for the whole batch.
                batch.outcomes[i] = "dlq"
                futures.append(await self.dead_letter(rec, value, "publish"))
                continue
            futures.append(await self.output.send(key=rec.key, value=value, headers=self.records.result_headers(rec)))
        for rej in batch.rejected:
            rec = source_record(rej.event)
            reason = decode_reason(rej.error)
            log.warning("dead-letter %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, reason)
            # Its class only: bad input's traceback says nothing (docs/OPERATIONS.md).
            futures.append(await self.dead_letter(rec, reason, "decode", class_path(rej.error)))
        for item in batch.routed_late:
            rec = source_record(item.event)
            futures.append(await self.late(rec, item.deadline_wall_ms, timing.done_wall, item.late_rule or RULE_OVERDUE))
        return futures

    async def dead_letter(
        self, rec: SourceRecord, reason: str, stage: str, error: str | None = None
    ) -> Awaitable[Any]:
        if self.dead_letter_topic is None:
            # No DLQ configured: failing loudly keeps the event unacked (replayed),
            # rather than acking input nobody will ever see again.
            raise RuntimeError(
                f"{rec.topic}[{rec.partition}]@{rec.offset} cannot be scored ({reason}) and no dlq_topic is set"
            )
        copy = self.records.dead_letter(rec, reason, stage, error=error)
        return await self.dead_letter_topic.send(key=copy.key, value=copy.value, headers=copy.headers)

    async def late(self, rec: SourceRecord, deadline_wall_ms: float, now_wall_ms: int, rule: str) -> Awaitable[Any]:
        if self.late_topic is None:
            raise ValueError("expiry_action='route_late' needs a late_topic")
        copy = self.records.late(rec, deadline_wall_ms, now_wall_ms, rule)
        return await self.late_topic.send(key=copy.key, value=copy.value, headers=copy.headers)
