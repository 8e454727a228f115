"""Offline sinks beside the Kafka result topic (Parquet, Redis, ...).

Sink contract (quixstreams-style checkpointing): `write(rows)` takes scored rows from
executor threads; each row carries `ack()`, which the sink calls exactly once when that
row is durable (e.g. its Parquet file finished and renamed). The worker commits an
offset only after every sink acked it, so a sink that buffers simply delays commits.
`poll()` runs periodically in the source thread (time-based rolling), `flush()` makes
everything durable (shutdown, partition revoke), `close()` releases resources.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.codecs.base import Decoded
from consumers.records import SourceRecord


@dataclass(slots=True)
class ScoredRow:
    rec: SourceRecord
    decoded: Decoded  # the request as decoded (input columns for offline rows)
    result: dict[str, Any]  # the document published to the result topic
    ack: Callable[[], None]


class ResultSink(Protocol):
    name: str

    def write(self, rows: list[ScoredRow]) -> None: ...

    def poll(self) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
