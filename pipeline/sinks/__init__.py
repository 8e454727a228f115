"""Offline sinks beside the Kafka result topic (Parquet, Redis, ...).

Sink contract (quixstreams-style checkpointing): `write(rows)` takes scored rows from
executor threads; each row carries `ack()`, which the sink calls exactly once when that
row is durable (e.g. its Parquet file finished and renamed). The worker commits an
offset only after every sink acked it, so a sink that buffers simply delays commits.
`poll()` runs periodically in the source thread (time-based rolling), `flush()` makes
everything durable (shutdown, partition revoke), `close()` releases resources.

Optional offset-aware extension (`OffsetAwareSink`, used by the Parquet sink): a sink
that writes rows in offset order must know which consumed offsets will never bring a
row. The worker calls, on sinks that define them (`notify()`):
`track(records)` for every consumed record, before it is decoded; `skip(records)` for
tracked records that end without a row (dead letter, routed late, dropped replay);
`revoke(tps)` when partitions are being revoked (finish their files once their
in-flight rows are in, then forget them). Every tracked offset ends in exactly one of
write() or skip().
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.records import SourceRecord, TopicPartition
from pipeline.codecs.base import Decoded


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


class OffsetAwareSink(ResultSink, Protocol):
    def track(self, records: Sequence[SourceRecord]) -> None: ...

    def skip(self, records: Sequence[SourceRecord]) -> None: ...

    def revoke(self, tps: Sequence[TopicPartition]) -> None: ...


def notify(sinks: Sequence[ResultSink], method: str, arg: Sequence[Any]) -> None:
    """Call the optional OffsetAwareSink `method` on each sink that defines it."""
    if not arg:
        return
    for sink in sinks:
        fn = getattr(sink, method, None)
        if fn is not None:
            fn(arg)
