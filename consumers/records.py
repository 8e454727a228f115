"""Client-neutral record types, so the worker does not depend on one Kafka client."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SendError:
    """Why Kafka did not take a produced record. `refused`: the record itself was
    refused (over a size limit, or invalid), so sending it again cannot succeed and the
    caller must change it (pipeline/delivery/outcomes.py); `forbidden`: the principal lacks an
    ACL for the topic, so neither a retry nor a dead letter can help and the worker
    stops (`reason` is then consumers/kafka_failures.py's one line); otherwise the error
    is the broker's or the network's, and a retry may succeed."""

    reason: str  # one line
    refused: bool = False
    forbidden: bool = False


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
    # timestamp_ms is the broker's append time (topic config message.timestamp.type=
    # LogAppendTime), not the producer's: then the produce leg can be split off
    # (docs/OPERATIONS.md, "Where the time goes"). Last, with a default: tests and
    # pipeline/profiling/stages.py build records positionally.
    log_append_time: bool = False

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


# A request header a producer may stamp: the wall-clock ms of its produce() call, as
# ASCII digits. With a LogAppendTime input topic the worker then times the produce leg
# (tidebatch_stage_seconds{stage="to_broker"}, pipeline/worker/publisher.py);
# `tidebatch produce` stamps it (pipeline/commands/produce.py). The dead-letter headers
# are in consumers/dead_letter.py; a DLQ replay drops every tidebatch.* header
# (pipeline/dlq/letters.py), so a replayed request never carries a stale one.
H_PRODUCED_MS = "tidebatch.produced_ms"
_MAX_MS_DIGITS = 19  # int64; also keeps int() clear of Python's 4300-digit refusal


def produced_ms(headers: Mapping[str, bytes]) -> int | None:
    """The request's `tidebatch.produced_ms` header, or None when it is absent or not a
    plain ASCII integer: the header is a measurement aid, and a bad one is ignored,
    never an error."""
    raw = headers.get(H_PRODUCED_MS)
    if not isinstance(raw, bytes) or not 0 < len(raw) <= _MAX_MS_DIGITS or not raw.isdigit():
        return None
    return int(raw)


def headers_to_dict(headers: list[tuple[str, bytes | None]] | None) -> dict[str, bytes]:
    """Kafka headers are a list and may repeat; the last value of a name wins."""
    if not headers:
        return {}
    return {k: (v if v is not None else b"") for k, v in headers}


CommitCallback = Callable[[Exception | None], None]


class Source(Protocol):
    """A consumer-group member's Kafka input, whichever client serves it
    (consumers/confluent_backend.py, consumers/kafka_python_backend.py). Rebalance
    callbacks, given at construction, run inside poll_batch() in the caller's thread."""

    def poll_batch(self, max_records: int, timeout: float) -> list[SourceRecord]: ...

    def commit(self, offsets: Mapping[TopicPartition, int], on_done: CommitCallback | None = None) -> None:
        """Commit offsets (the next offset to read, per partition). With on_done,
        asynchronously: on_done(None or the error) runs inside a later poll_batch()."""
        ...

    def assignment(self) -> list[TopicPartition]: ...

    def pause_all(self) -> None: ...

    def resume_all(self) -> None: ...

    @property
    def paused(self) -> bool: ...

    def lag(self) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...


class TransactionalSource(Source, Protocol):
    """A Source whose offsets can go into a producer's transaction (delivery exactly_once)."""

    def group_metadata(self) -> object:
        """The consumer group's metadata (generation, member id): the broker fences a
        transaction whose offsets come from a member that lost its partitions (KIP-447)."""
        ...

    def in_group(self) -> bool:
        """A member of the consumer group now (the coordinator gave it a member id that
        it has not since forgotten)."""
        ...

    def committed(self, tps: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int]:
        """The group's committed offsets of `tps` (stable: none of an open transaction),
        those without one left out. Raises KafkaError-derived exceptions on failure."""
        ...


class TransactionError(Exception):
    """A transaction step failed (consumers/confluent_backend.py says how librdkafka
    classifies it). `retriable`: the same step may be tried again; `abortable`: the
    transaction must be aborted, and its records produced again in a new one; `fatal`:
    this producer is done for (fenced by a newer instance with the same transactional.id,
    say) and the worker must stop without committing."""

    def __init__(self, reason: str, *, retriable: bool = False, abortable: bool = False, fatal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable
        self.abortable = abortable
        self.fatal = fatal


class KafkaRefused(Exception):
    """Kafka refuses this client for good (a topic or group ACL is missing,
    consumers/kafka_failures.py): its message is the one line the worker stops with."""


class TransactionalProducer(Protocol):
    """A Producer with a transactional.id (delivery exactly_once, pipeline/delivery/transactions.py).
    Every method raises TransactionError on failure."""

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def commit_transaction(
        self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout: float
    ) -> None:
        """Add the input offsets to the open transaction and commit it."""
        ...

    def abort_transaction(self, timeout: float) -> None: ...

    def renew(self) -> None:
        """Drop the client (and whatever it still queues) for a new one with the same
        settings and transactional.id; init_transactions() must be called next. For a
        client whose transaction state cannot be recovered in place (fenced, or an
        abort that failed), pipeline/delivery/transactions.py."""
        ...


class Producer(Protocol):
    """A Kafka producer, whichever client serves it."""

    max_record_bytes: int  # the largest record it accepts (key + value + headers)

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        on_ack: AckCallback,
    ) -> None:
        """Produce one record; on_ack gets exactly one call, with None or the error."""
        ...

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports for up to timeout s; how many were served."""
        ...

    def flush(self, timeout: float) -> int:
        """Wait for every record's report, up to timeout s; how many are still waiting."""
        ...
