"""A topic's record as `tidebatch read` prints it (pure; pipeline/dlq/read.py reads
the records): the value as it is, one per line, or with --meta one JSON object with
where the record is and its key and headers. Bytes that are not UTF-8 (a msgpack
request, a binary key) are shown as base64, marked so."""

from __future__ import annotations

import base64

import orjson

from pipeline.dlq.letters import DeadLetter


def value_line(record: DeadLetter) -> bytes:
    """The value as it is, with one newline: a result document is one line of JSON."""
    return (record.value or b"").rstrip(b"\n") + b"\n"


def meta_line(record: DeadLetter) -> bytes:
    """One JSON object: topic, partition, offset, timestamp_ms, key, headers, value."""
    doc = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": _text(record.key),
        "headers": [[k, _text(v)] for k, v in record.headers],
        "value": _text(record.value),
    }
    return orjson.dumps(doc) + b"\n"


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()
