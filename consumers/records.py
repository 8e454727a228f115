"""Client-neutral record types, so the worker does not depend on one Kafka client."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SendError:
    """Why Kafka did not take a produced record. `refused`: the record itself was
    refused (over a size limit, or invalid), so sending it again cannot succeed and the
    caller must change it (pipeline/outcomes.py); otherwise the error is the broker's or
    the network's, and a retry may succeed."""

    reason: str  # one line
    refused: bool = False


# Called once per produced record with None on success or the error.
AckCallback = Callable[[SendError | None], None]


@dataclass(slots=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int | None  # CreateTime (or LogAppendTime) of the request

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


def headers_to_dict(headers: list[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    """Kafka headers are a list and may repeat; the last value of a name wins."""
    if not headers:
        return {}
    return {k: (v if v is not None else b"") for k, v in headers}
