"""Outcome records: exactly one per consumed request -- its result, its dead letter or
its late record -- and the offset acknowledgement that follows Kafka's.

Why a record Kafka refuses never stops the worker (docs/ARCHITECTURE.md, "Size
limits"): a worker that stops on a record stops again on the same one after every
restart, so one message could take a consumer group down for good. Instead:
- a result over the output topic's limit, or refused by Kafka, becomes the request's
  dead letter, with the reason;
- a dead-letter or late copy is cut down to fit its topic (consumers/dead_letter.py);
  if Kafka refuses it all the same (a topic limit lower than the one known at start),
  the minimal copy -- no value, our headers -- is sent instead, and a refused late
  record becomes a dead letter;
- if even the minimal dead letter is refused, `limits.on_undeliverable` decides:
  "skip" (default: one error line naming the offset, outcome="undeliverable", the
  offset is released) or "stop" (exit 1 without committing past it, naming the offset
  and how to skip it).
Errors of the broker or the network, not of the record, are retried; when retries run
out the worker stops without committing past the request (a restart replays it once
the broker is back, which is no loop on one record).

What each record is -- topic, key, value, headers, and the reasons dead letters give --
is OutcomeRecords' (pure), which the Faust path sends too (pipeline/faust/outcomes.py),
so both write the same bytes for the same request and outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from consumers.dead_letter import (
    Copy,
    Headers,
    Origin,
    dead_letter_copy,
    late_copy,
    one_line,
    record_bytes,
)
from consumers.records import Producer, SendError, SourceRecord
from pipeline.clock import wall_ms
from pipeline.codecs.base import DecodeError
from pipeline.delivery.limits import Limits
from pipeline.observe.metrics import observe_many
from pipeline.sinks import ResultSink, notify

if TYPE_CHECKING:
    from pipeline.delivery.transactions import Transactions

log = logging.getLogger(__name__)

MAX_SEND_ATTEMPTS = 5


@dataclass(frozen=True)
class Topics:
    """The topics one worker writes, with their defaults in one place."""

    output: str
    dead_letter: str
    late: str

    @classmethod
    def for_input(cls, input_topic: str, output: str, dead_letter: str | None, late: str | None) -> Topics:
        return cls(output, dead_letter or f"{input_topic}.dlq", late or f"{input_topic}.late")

    def all(self) -> tuple[str, ...]:
        return (self.output, self.dead_letter, self.late)


def decode_reason(exc: Exception) -> str:
    """The dead letter's reason for a request its codec could not decode: the codec's
    own words for invalid input (DecodeError), else a codec bug, said as one."""
    if isinstance(exc, DecodeError):
        return str(exc)
    return f"decoder crashed: {type(exc).__name__}: {exc}"


def result_value(doc: dict[str, Any], too_large: Callable[[bytes], str | None],
                 encode: Callable[[dict[str, Any]], bytes] = orjson.dumps) -> bytes | str:
    """The result record's value, or why the result cannot be published (the reason of
    its dead letter): it cannot be serialised, or `too_large` (the output topic's
    check, OutcomeRecords.result_too_large) says why. `encode`: JSON, or the codec's
    own result records (a schema-registry codec's, pipeline/codecs/schema_wire.py)."""
    try:
        value = encode(doc)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        return f"result cannot be serialised: {exc}"
    return too_large(value) or value


class OutcomeRecords:
    """What each outcome's record is: its topic, key, value and headers (no I/O).

    limits: what each topic takes (may be replaced once the broker has described its
    topics). carry_headers: the request headers its result carries too (config
    `result_headers`); dead-letter and late copies carry all of them already
    (consumers/dead_letter.py). origin: the group, member and codec class that dead
    letters name (Kafka Connect's headers)."""

    def __init__(
        self, topics: Topics, limits: Limits, *, carry_headers: Collection[str] = (), origin: Origin | None = None
    ) -> None:
        self.topics = topics
        self.limits = limits
        self.carry = frozenset(carry_headers)
        self.origin = origin

    def result_too_large(self, rec: SourceRecord, value: bytes) -> str | None:
        """Why this result cannot go to the output topic, or None if it fits."""
        limit = self.limits.for_topic(self.topics.output)
        size = record_bytes(rec.key, value, self.result_headers(rec))
        if size <= limit:
            return None
        return f"result is {size} bytes, over the {limit}-byte record limit of {self.topics.output}"

    def result_value(self, rec: SourceRecord, doc: dict[str, Any]) -> bytes | str:
        """The result record's value, or why this result cannot be published."""
        return result_value(doc, partial(self.result_too_large, rec))

    def result_headers(self, rec: SourceRecord, trace: Headers | None = None) -> Headers | None:
        """The request's headers its result carries; `trace`: the worker's own span's
        trace headers (pipeline/observe/tracing.py), in place of the request's."""
        headers = None
        if self.carry and rec.headers:
            headers = [(k, v) for k, v in rec.headers.items() if k in self.carry] or None
        if trace:
            replaced = {name for name, _ in trace}
            headers = [h for h in headers or () if h[0] not in replaced] + trace
        return headers

    def dead_letter(
        self,
        rec: SourceRecord,
        reason: str,
        stage: str,
        *,
        error: BaseException | str | None = None,
        minimal: bool = False,
    ) -> Copy:
        """The dead letter of `rec`, cut down to fit its topic; `minimal`: the smallest
        form, for a topic that refused the one that fitted the limit known."""
        limit = self.limits.for_topic(self.topics.dead_letter)
        prefix = 0 if minimal else self.limits.prefix_bytes
        return dead_letter_copy(rec, reason, stage, limit, prefix, minimal=minimal, origin=self.origin, error=error)

    def late(self, rec: SourceRecord, deadline_wall_ms: float, now_wall_ms: int, rule: str) -> Copy:
        """The late record of `rec`, routed unscored by `rule` at `now_wall_ms` (its
        deadline: `deadline_wall_ms`), cut down to fit its topic."""
        missed_by = max(now_wall_ms - deadline_wall_ms, 0.0)
        limit = self.limits.for_topic(self.topics.late)
        return late_copy(rec, missed_by, limit, self.limits.prefix_bytes, rule=rule)


class Outcomes:
    """Sends outcome records and acknowledges each request's offset once Kafka has its
    outcome. Thread-safe: called from the source thread (dead letters of decoding,
    late routing, delivery reports) and the publisher thread (results)."""

    def __init__(
        self,
        producer: Producer,
        ack: Callable[[SourceRecord], None],
        topics: Topics,
        limits: Limits,
        *,
        metrics: Any,
        pipeline: str,
        sinks: Sequence[ResultSink] = (),
        on_undeliverable: str = "skip",
        count: Callable[[str, int], None] = lambda _name, _n: None,
        fail: Callable[[str], None],
        transactions: Transactions | None = None,
        carry_headers: Collection[str] = (),
        origin: Origin | None = None,
    ) -> None:
        """transactions: delivery exactly_once (pipeline/delivery/transactions.py): every
        outcome record goes through it, in offset order, and a failed delivery aborts
        the transaction instead of being retried here. carry_headers: the request
        headers its result carries too (config `result_headers`: W3C trace context by
        default, so a trace goes on past the worker); dead-letter and late copies carry
        all of them already (consumers/dead_letter.py). origin: the group, member and
        codec class that dead letters name (Kafka Connect's headers): OutcomeRecords
        builds each record from them."""
        self.producer = producer
        self._ack = ack
        self.records = OutcomeRecords(topics, limits, carry_headers=carry_headers, origin=origin)
        self.metrics = metrics
        self.pipeline = pipeline
        self.sinks = list(sinks)
        self.on_undeliverable = on_undeliverable
        self._count = count
        self._fail = fail
        self._transactions = transactions
        # Results ready → acknowledged by Kafka: the last stage of tidebatch_stage_seconds,
        # kept in ms by the delivery callbacks and observed in bulk by observe_stages():
        # one histogram observe per result on the source thread cost ~2 % at saturation.
        self._publish_stage = metrics.stage.labels(pipeline, "publish")
        self._publish_ms: list[int] = []

    @property
    def topics(self) -> Topics:
        return self.records.topics

    @property
    def limits(self) -> Limits:
        return self.records.limits

    @limits.setter
    def limits(self, limits: Limits) -> None:
        """Known once the broker has described the topics (pipeline/worker/core.py)."""
        self.records.limits = limits

    # ------------------------------------------------------------------ results
    def result_too_large(self, rec: SourceRecord, value: bytes) -> str | None:
        """Why this result cannot go to the output topic, or None if it fits."""
        return self.records.result_too_large(rec, value)

    def result(
        self, rec: SourceRecord, value: bytes, ready_wall_ms: int | None = None,
        trace: list[tuple[str, bytes]] | None = None,
    ) -> None:
        """Send a result that fits (result_too_large said None). If Kafka refuses it
        all the same, the request is dead-lettered instead; its sink rows were already
        written, so the sinks are not told to skip it. `ready_wall_ms`: when its batch's
        results were ready; the time from then to Kafka's ack is the "publish" stage.
        `trace`: the trace headers of the worker's own span (pipeline/observe/tracing.py), in
        place of the request's."""

        def refused(err: SendError) -> None:
            self.dead_letter(rec, f"Kafka refused the result: {err.reason}", "publish", rows_written=True)

        headers = self.records.result_headers(rec, trace)
        self._send(self.topics.output, rec.key, value, headers, rec, refused, ready_wall_ms=ready_wall_ms)

    def observe_stages(self) -> None:
        """Observe the publish times the delivery reports since the last call noted
        (the source loop calls this every turn, and shutdown after its flush)."""
        if self._publish_ms:
            done, self._publish_ms = self._publish_ms, []
            observe_many(self._publish_stage, [max(ms, 0) / 1000.0 for ms in done])

    def settle(self, rec: SourceRecord) -> None:
        """The request's outcome has no record (a dropped replay, an undeliverable dead
        letter): its offset is done."""
        self._ack(rec)
        if self._transactions is not None:
            self._transactions.deliver(rec, None)

    # ------------------------------------------------------------------ dead letters
    def dead_letter(
        self,
        rec: SourceRecord,
        reason: str,
        stage: str,
        *,
        rows_written: bool = False,
        error: BaseException | str | None = None,
    ) -> None:
        """The request's outcome is a dead letter with `reason` (one line); `error`: the
        exception (or its class name) behind it, for the Connect headers."""
        log.warning("dead-letter %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, one_line(reason)[:300])
        self.metrics.outcome(rec.topic, "dlq")
        self._count("dlq", 1)
        if not rows_written:
            notify(self.sinks, "skip", [rec])  # no row will come for this offset
        copy = self.records.dead_letter(rec, reason, stage, error=error)

        def refused(err: SendError) -> None:
            # Over a limit we did not know (the topic's is lower): the smallest copy.
            minimal = self.records.dead_letter(rec, reason, stage, error=error, minimal=True)
            self._send_copy(self.topics.dead_letter, minimal, rec, lambda e: self._undeliverable(rec, reason, e))

        self._send_copy(self.topics.dead_letter, copy, rec, refused)

    def _undeliverable(self, rec: SourceRecord, reason: str, err: SendError) -> None:
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
        if self.on_undeliverable == "stop":
            self._fail(
                f"no outcome can be written for {where} ({one_line(reason)[:200]}): {self.topics.dead_letter} "
                f"refused even its minimal dead letter ({err.reason}); to skip it, commit offset "
                f"{rec.offset + 1} of partition {rec.partition} for this group, or set "
                "limits.on_undeliverable: skip"
            )
            return
        log.error(
            "no outcome written for %s: %s refused even its minimal dead letter (%s); skipped "
            "(limits.on_undeliverable: skip); reason it was dead-lettered: %s",
            where, self.topics.dead_letter, err.reason, one_line(reason)[:200],
        )
        self.metrics.outcome(rec.topic, "undeliverable")
        self._count("undeliverable", 1)
        self.settle(rec)

    # ------------------------------------------------------------------ late records
    def late(self, late: Sequence[tuple[SourceRecord, float]], now_wall_ms: int, rule: str) -> None:
        """Route requests unscored to the late topic: (record, deadline in wall ms), all
        routed by `rule` (pipeline/batching/request.py RULE_*)."""
        notify(self.sinks, "skip", [rec for rec, _ in late])
        if late:
            self.metrics.routed_late.labels(self.pipeline, rule).inc(len(late))
        for rec, deadline_wall_ms in late:
            self.metrics.outcome(rec.topic, "routed_late")
            self.metrics.slo_misses.labels(self.pipeline).inc()
            copy = self.records.late(rec, deadline_wall_ms, now_wall_ms, rule)

            def refused(err: SendError, rec: SourceRecord = rec) -> None:
                self.dead_letter(rec, f"Kafka refused its late record: {err.reason}", "late", rows_written=True)

            self._send_copy(self.topics.late, copy, rec, refused)
        self._count("routed_late", len(late))

    # ------------------------------------------------------------------ sending
    def _send_copy(self, topic: str, copy: Copy, rec: SourceRecord, refused: Callable[[SendError], None]) -> None:
        self._send(topic, copy.key, copy.value, copy.headers, rec, refused)

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        rec: SourceRecord,
        refused: Callable[[SendError], None],
        attempt: int = 1,
        ready_wall_ms: int | None = None,
    ) -> None:
        """Produce one outcome record; its ack completes the source offset."""

        def on_ack(err: SendError | None) -> None:
            if err is None:
                self._ack(rec)
                if ready_wall_ms is not None:
                    self._publish_ms.append(wall_ms() - ready_wall_ms)
                return
            self.metrics.delivery_errors.labels(self.pipeline, topic).inc()
            if err.forbidden:  # a missing ACL: stop before anything commits past this record
                self._fail(err.reason)
            elif err.refused:
                refused(err)
            elif self._transactions is not None:
                # Not retried here: the abort produces the transaction's records again.
                self._transactions.doomed(f"delivery to {topic} failed: {err.reason}")
            elif attempt < MAX_SEND_ATTEMPTS:
                log.warning("delivery to %s failed (attempt %d): %s; retrying", topic, attempt, err.reason)
                self._send(topic, key, value, headers, rec, refused, attempt + 1, ready_wall_ms)
            else:
                self._fail(f"cannot deliver to {topic}: {err.reason}")

        if self._transactions is None:
            self.producer.send(topic, key, value, headers, on_ack)
        else:
            self._transactions.deliver(rec, lambda: self.producer.send(topic, key, value, headers, on_ack))
