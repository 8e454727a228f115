"""Dead-letter and late records: the original bytes, unchanged, plus headers that say
what went wrong and where the record came from, so it can be inspected and replayed."""

from __future__ import annotations

from consumers.records import SourceRecord

H_ERROR = "tidebatch.error"
H_STAGE = "tidebatch.stage"
H_TOPIC = "tidebatch.source.topic"
H_PARTITION = "tidebatch.source.partition"
H_OFFSET = "tidebatch.source.offset"
H_TIMESTAMP = "tidebatch.source.timestamp_ms"
H_DEADLINE_MISSED_BY = "tidebatch.deadline_missed_by_ms"


def source_headers(rec: SourceRecord) -> list[tuple[str, bytes]]:
    return [
        (H_TOPIC, rec.topic.encode()),
        (H_PARTITION, str(rec.partition).encode()),
        (H_OFFSET, str(rec.offset).encode()),
        (H_TIMESTAMP, str(rec.timestamp_ms if rec.timestamp_ms is not None else "").encode()),
    ]


def dlq_headers(rec: SourceRecord, reason: str, stage: str = "decode") -> list[tuple[str, bytes]]:
    """Original headers first (kept for replay), then ours."""
    one_line = " ".join(reason.split())[:1000]
    original = [(k, v) for k, v in rec.headers.items() if not k.startswith("tidebatch.")]
    return original + [(H_ERROR, one_line.encode()), (H_STAGE, stage.encode())] + source_headers(rec)


def late_headers(rec: SourceRecord, missed_by_ms: float) -> list[tuple[str, bytes]]:
    original = [(k, v) for k, v in rec.headers.items() if not k.startswith("tidebatch.")]
    return original + [(H_DEADLINE_MISSED_BY, f"{missed_by_ms:.1f}".encode())] + source_headers(rec)
