"""What the Faust batching driver reads off a Faust event: its Kafka timestamp, its
topic and its position (topic-partition, offset, consumer generation). Only attributes
of ``event.message`` are read, so Faust is never imported."""

from __future__ import annotations

from typing import Any

from pipeline.faust.acks import PartitionKey


def kafka_timestamp_ms(event: Any) -> float | None:
    """Faust messages carry the Kafka timestamp in seconds (a float)."""
    ts = getattr(getattr(event, "message", None), "timestamp", None)
    return float(ts) * 1000.0 if ts else None


def event_topic(event: Any) -> str:
    return str(getattr(getattr(event, "message", None), "topic", "") or "")


def event_position(event: Any) -> tuple[PartitionKey, int, Any]:
    """(topic, partition), offset and consumer generation of a Faust event."""
    m = event.message
    return (str(m.topic), int(m.partition)), int(m.offset), getattr(m, "generation_id", None)
