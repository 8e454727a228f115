"""Dead-letter and late records: the original bytes plus headers that say what went
wrong and where the record came from, so it can be inspected and replayed.

A copy must always fit: a dead-letter record that Kafka refuses would leave its
request without an outcome, and a worker that stops on it stops again on the same
record after every restart. So a copy that would exceed the limit of the topic it goes
to carries a prefix of the value (or, at the last resort, none) plus headers that say
so: the original size and SHA-256, and which parts were cut. The original itself stays
where `tidebatch.source.{topic,partition,offset}` say, for as long as that topic's
retention keeps it (docs/ARCHITECTURE.md, "Size limits").

Every dead letter also carries Kafka Connect's `__connect.errors.*` context headers
(errors.deadletterqueue.context.headers.enable), so tools and people used to Connect's
dead-letter queues read ours alike; docs/OPERATIONS.md, "Dead letters: inspect and
replay", maps tidebatch's meaning onto each. They are "our headers": kept by every
copy, the minimal one included, and bounded, so pipeline/delivery/limits.py's headroom holds."""

from __future__ import annotations

import hashlib
import os
import socket
import traceback
from dataclasses import dataclass

from consumers.records import SourceRecord

H_ERROR = "tidebatch.error"
H_STAGE = "tidebatch.stage"
H_TOPIC = "tidebatch.source.topic"
H_PARTITION = "tidebatch.source.partition"
H_OFFSET = "tidebatch.source.offset"
H_TIMESTAMP = "tidebatch.source.timestamp_ms"
H_DEADLINE_MISSED_BY = "tidebatch.deadline_missed_by_ms"
H_LATE_RULE = "tidebatch.late_rule"  # which rule routed it (pipeline/batching/request.py RULE_*)
# Set only on a copy that had to be cut to fit its topic.
H_TRUNCATED = "tidebatch.truncated"  # what was cut: "value", "value,headers", "value,headers,key"
H_VALUE_BYTES = "tidebatch.original.value_bytes"
H_VALUE_SHA256 = "tidebatch.original.value_sha256"
H_KEY_BYTES = "tidebatch.original.key_bytes"
# Set by `tidebatch dlq replay` on a request it sends again (pipeline/dlq/letters.py):
# the dead letter it came from ("<dlq topic>/<partition>/<offset>") and the request's
# first dead letter. A dead letter of such a request keeps both among our headers, so
# the next replay knows the request already had its second chance and skips it
# (pipeline/dlq/replay.py: a request that can never pass must not loop).
H_REPLAYED_FROM = "tidebatch.replayed.from"
H_REPLAYED_ORIGIN = "tidebatch.replayed.origin"
REPLAY_HEADERS = (H_REPLAYED_FROM, H_REPLAYED_ORIGIN)

# Allowance for a record's framing (record batch header, varints, lengths) on top of
# its key, value and headers: librdkafka counts ~100 bytes, the broker a batch header.
RECORD_OVERHEAD_BYTES = 512
# A key kept in a cut-down copy: enough to recognise it, never a size problem.
KEY_PREFIX_BYTES = 256
MAX_REASON_CHARS = 1000
# Bounds that keep our headers within pipeline/delivery/limits.py's DEAD_LETTER_HEADROOM_BYTES
# (a unit test adds up the worst case): Kafka's own limit on a topic or group name is
# 249 characters, and a traceback's last lines say where it was raised.
MAX_NAME_CHARS = 249
MAX_STACKTRACE_CHARS = 2000
# A replay header's value: a topic name, a partition and an offset.
MAX_WHERE_CHARS = MAX_NAME_CHARS + 32

# Kafka Connect's dead-letter context headers (its DeadLetterQueueReporter's names).
C_TOPIC = "__connect.errors.topic"
C_PARTITION = "__connect.errors.partition"
C_OFFSET = "__connect.errors.offset"
C_CONNECTOR = "__connect.errors.connector.name"
C_TASK = "__connect.errors.task.id"
C_STAGE = "__connect.errors.stage"
C_CLASS = "__connect.errors.class.name"
C_EXCEPTION = "__connect.errors.exception.class.name"
C_MESSAGE = "__connect.errors.exception.message"
C_STACKTRACE = "__connect.errors.exception.stacktrace"

# tidebatch's stage -> Connect's Stage enum, so a filter on Connect's values works.
CONNECT_STAGES = {
    "admit": "KAFKA_CONSUME",  # refused as consumed, before decoding (size limit)
    "decode": "VALUE_CONVERTER",
    "inference": "TASK_PUT",
    "publish": "KAFKA_PRODUCE",
    "late": "KAFKA_PRODUCE",  # Kafka refused its late record
}
# The exception class where no exception was raised: a limit or a refusal is a
# decision, named here (not importable classes; documented with the headers).
STAGE_ERRORS = {
    "admit": "tidebatch.RequestTooLarge",
    "decode": "pipeline.codecs.base.DecodeError",
    "inference": "tidebatch.ModelRejected",
    "publish": "tidebatch.RecordRefused",
    "late": "tidebatch.RecordRefused",
}

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class Origin:
    """Who wrote the dead letter: Connect's connector.name (the consumer group),
    task.id (this member) and class.name (the pipeline's codec class)."""

    group_id: str = ""
    task_id: str = ""
    class_name: str = ""


def member_id(instance_id: str | None) -> str:
    """A worker's task.id: its group.instance.id (static membership), else host:pid,
    which names the process whose logs tell more."""
    return instance_id or f"{socket.gethostname()}:{os.getpid()}"


def class_path(obj: object) -> str:
    """`module.Class` of an object, or of a class."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True, slots=True)
class Copy:
    """One outgoing dead-letter or late record."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    truncated: bool = False


def record_bytes(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """What a record counts against a size limit, framing allowance included."""
    size = RECORD_OVERHEAD_BYTES + len(key or b"") + len(value or b"")
    for name, data in headers or ():
        size += len(name) + len(data)
    return size


def one_line(reason: str) -> str:
    """A reason as one bounded line (a header value, a log line)."""
    return " ".join(reason.split())[:MAX_REASON_CHARS]


def bounded(text: str, max_bytes: int) -> bytes:
    """`text` as UTF-8 of at most `max_bytes`, cut at a character boundary: the
    headroom counts bytes, and a reason of 1000 characters can be 4000 bytes."""
    return text.encode()[:max_bytes].decode("utf-8", "ignore").encode()


def source_headers(rec: SourceRecord) -> Headers:
    return [
        (H_TOPIC, rec.topic.encode()),
        (H_PARTITION, str(rec.partition).encode()),
        (H_OFFSET, str(rec.offset).encode()),
        (H_TIMESTAMP, str(rec.timestamp_ms if rec.timestamp_ms is not None else "").encode()),
    ]


def _original(rec: SourceRecord) -> Headers:
    """The request's own headers, kept for replay (ours from an earlier hop are not)."""
    return [(k, v) for k, v in rec.headers.items() if not k.startswith("tidebatch.")]


def connect_headers(
    rec: SourceRecord, reason: str, stage: str, origin: Origin | None = None, error: BaseException | str | None = None
) -> Headers:
    """Kafka Connect's context headers of a dead letter. `error`: the exception (its
    class, and its traceback if it still has one) or a class name; None: the stage's
    STAGE_ERRORS name. Without an `origin`, connector, task and class are left out."""
    if isinstance(error, BaseException):
        exc_class, trace = class_path(error), _stacktrace(error)
    else:
        exc_class, trace = error or STAGE_ERRORS.get(stage, "tidebatch.Error"), None
    out = [
        (C_TOPIC, bounded(rec.topic, MAX_NAME_CHARS)),
        (C_PARTITION, str(rec.partition).encode()),
        (C_OFFSET, str(rec.offset).encode()),
        (C_STAGE, CONNECT_STAGES.get(stage, stage.upper()).encode()),
    ]
    if origin is not None:
        out += [
            (C_CONNECTOR, bounded(origin.group_id, MAX_NAME_CHARS)),
            (C_TASK, bounded(origin.task_id, MAX_NAME_CHARS)),
            (C_CLASS, bounded(origin.class_name, MAX_NAME_CHARS)),
        ]
    out += [(C_EXCEPTION, bounded(exc_class, MAX_NAME_CHARS)), (C_MESSAGE, bounded(one_line(reason), MAX_REASON_CHARS))]
    if trace:
        out.append((C_STACKTRACE, trace.encode()))
    return out


def _stacktrace(exc: BaseException) -> str | None:
    """The traceback's last MAX_STACKTRACE_CHARS (where it was raised), if it has one:
    a refused request's has been dropped (pipeline/worker/admission.py, drop_traceback)."""
    if exc.__traceback__ is None:
        return None
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text.encode()[-MAX_STACKTRACE_CHARS:].decode("utf-8", "ignore")


def _dlq_own(
    rec: SourceRecord, reason: str, stage: str, origin: Origin | None = None, error: BaseException | str | None = None
) -> Headers:
    own = [(H_ERROR, bounded(one_line(reason), MAX_REASON_CHARS)), (H_STAGE, stage.encode())] + source_headers(rec)
    return own + replay_marks(rec) + connect_headers(rec, reason, stage, origin, error)


def replay_marks(rec: SourceRecord) -> Headers:
    """The replay headers a replayed request came with, kept (bounded) in its dead letter."""
    return [(k, bounded(v.decode("utf-8", "replace"), MAX_WHERE_CHARS)) for k in REPLAY_HEADERS if (v := rec.headers.get(k))]


def _late_own(rec: SourceRecord, missed_by_ms: float, rule: str | None) -> Headers:
    own = [(H_DEADLINE_MISSED_BY, f"{missed_by_ms:.1f}".encode())]
    if rule is not None:
        own.append((H_LATE_RULE, rule.encode()))
    return own + source_headers(rec)


def dead_letter_copy(
    rec: SourceRecord,
    reason: str,
    stage: str,
    limit: int,
    prefix_bytes: int,
    *,
    minimal: bool = False,
    origin: Origin | None = None,
    error: BaseException | str | None = None,
) -> Copy:
    """The dead-letter record of `rec`, cut down to fit `limit` bytes if it must be;
    `origin` and `error` fill the Connect headers (connect_headers)."""
    return fit_copy(rec, _dlq_own(rec, reason, stage, origin, error), limit, prefix_bytes, minimal=minimal)


def late_copy(
    rec: SourceRecord,
    missed_by_ms: float,
    limit: int,
    prefix_bytes: int,
    *,
    minimal: bool = False,
    rule: str | None = None,
) -> Copy:
    """The late record of `rec`, cut down to fit `limit` bytes if it must be; `rule`:
    which rule routed it, when the caller knows."""
    return fit_copy(rec, _late_own(rec, missed_by_ms, rule), limit, prefix_bytes, minimal=minimal)


def fit_copy(rec: SourceRecord, own: Headers, limit: int, prefix_bytes: int, *, minimal: bool = False) -> Copy:
    """A copy of `rec` with our headers `own` that counts at most `limit` bytes
    (record_bytes), giving up, in this order, only what it must: the value beyond a
    prefix of at most `prefix_bytes`, the request's own headers, the key beyond
    KEY_PREFIX_BYTES. `minimal` gives all of them up at once: the form to send when
    the broker refused a copy that fitted the limit we knew (its topic's limit is
    lower), which only our headers can still exceed."""
    original = _original(rec)
    key, value = rec.key, rec.value
    if not minimal and record_bytes(key, value, original + own) <= limit:
        return Copy(key, value, original + own)
    value = value or b""
    cut: list[str] = []
    notes = [(H_VALUE_BYTES, str(len(value)).encode()), (H_VALUE_SHA256, hashlib.sha256(value).hexdigest().encode())]
    headers = original + own
    if minimal or record_bytes(key, None, headers + notes) + 64 > limit:
        cut.append("headers")
        headers = list(own)
    too_big = minimal or record_bytes(key, None, headers + notes) + 64 > limit
    if key is not None and too_big and len(key) > KEY_PREFIX_BYTES:
        cut.append("key")
        notes.append((H_KEY_BYTES, str(len(key)).encode()))
        key = key[:KEY_PREFIX_BYTES]
    # Room for the value once the header naming what was cut is in (at most 32 bytes).
    room = limit - record_bytes(key, None, headers + notes) - len(H_TRUNCATED) - 32
    keep = 0 if minimal else max(0, min(prefix_bytes, room, len(value)))
    if keep < len(value):
        cut.insert(0, "value")
    notes.append((H_TRUNCATED, ",".join(cut).encode()))
    return Copy(key, value[:keep], headers + notes, truncated=True)
