"""Dead-letter records as `tidebatch dlq` reads them (pure): what the headers of
consumers/dead_letter.py say, how reasons are grouped, which records a filter selects
and what a replay sends.

A replayed record carries H_REPLAYED_FROM, "<dlq topic>/<partition>/<offset>" of its
dead letter, so a result (or a second dead letter) can be traced back to the replay,
and H_REPLAYED_ORIGIN, the request's first dead letter, so its returns count together
however often it was replayed. A worker keeps both in the dead letter of a replayed
request (consumers/dead_letter.py, replay_marks)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from consumers.dead_letter import (
    H_ERROR,
    H_OFFSET,
    H_PARTITION,
    H_REPLAYED_FROM,
    H_REPLAYED_ORIGIN,
    H_STAGE,
    H_TOPIC,
    H_TRUNCATED,
    Headers,
)

# Headers a worker adds to a dead letter; everything else is the request's own.
OUR_PREFIXES = ("tidebatch.", "__connect.errors.")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of a dead-letter topic."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None  # when it was dead-lettered
    key: bytes | None
    value: bytes | None
    headers: Headers

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v.decode("utf-8", "replace") if v is not None else ""
        return None

    @property
    def reason(self) -> str:
        return self.header(H_ERROR) or "(no tidebatch.error header)"

    @property
    def stage(self) -> str:
        return self.header(H_STAGE) or "?"

    @property
    def source(self) -> str:
        """topic[partition]@offset of the request it stands for."""
        return f"{self.header(H_TOPIC) or '?'}[{self.header(H_PARTITION) or '?'}]@{self.header(H_OFFSET) or '?'}"

    @property
    def source_topic(self) -> str:
        return self.header(H_TOPIC) or "?"

    @property
    def truncated(self) -> str | None:
        """What was cut to fit the topic ("value", "value,headers", ...), or None: a cut
        copy is not the request any more and is never replayed."""
        return self.header(H_TRUNCATED)

    @property
    def where(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"

    @property
    def replayed_from(self) -> str | None:
        """The dead letter whose replay this one is: set when the request had been
        replayed already and failed again."""
        return self.header(H_REPLAYED_FROM) or None

    @property
    def origin(self) -> str:
        """The request's first dead letter: this one, unless it came back from a replay."""
        return self.header(H_REPLAYED_ORIGIN) or self.replayed_from or self.where

    def replay_headers(self) -> Headers:
        """The request's own headers (the worker put them first and ours after), and
        the markers that say which dead letter this replay came from and which was
        the request's first."""
        own = [(k, v) for k, v in self.headers if not k.startswith(OUR_PREFIXES)]
        return own + [(H_REPLAYED_FROM, self.where.encode()), (H_REPLAYED_ORIGIN, self.origin.encode())]


# What varies between records of one kind of failure: ids, sizes, positions. Replaced
# in this order, so a UUID is not read as numbers.
_VARYING = (
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}\b"), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "N"),
)
MAX_GROUP_CHARS = 200


def reason_group(reason: str) -> str:
    """The reason with what varies from record to record taken out, so that
    "request is 600123 bytes, over the 524288-byte limit" and "request is 700001 bytes,
    over the 524288-byte limit" count together: UUIDs become <id>, hex runs of 16+
    digits <hex>, every number N. Words (field names, exception classes) stay."""
    for pattern, repl in _VARYING:
        reason = pattern.sub(repl, reason)
    return reason[:MAX_GROUP_CHARS]


@dataclass(frozen=True)
class Selection:
    """Which dead letters a command looks at: dead-lettered at or after `since_ms`,
    with a reason matching `reason` (a regular expression, searched), at one of
    `stages`. Empty fields select everything."""

    since_ms: int | None = None
    reason: re.Pattern[str] | None = None
    stages: Sequence[str] = ()

    @classmethod
    def of(cls, since_ms: int | None = None, reason: str | None = None, stages: Sequence[str] = ()) -> Selection:
        try:
            pattern = re.compile(reason) if reason else None
        except re.error as exc:
            raise ValueError(f"--reason {reason!r} is not a regular expression: {exc}") from None
        return cls(since_ms, pattern, tuple(stages))

    def matches(self, letter: DeadLetter) -> bool:
        if self.since_ms is not None and (letter.timestamp_ms is None or letter.timestamp_ms < self.since_ms):
            return False
        if self.stages and letter.stage not in self.stages:
            return False
        return self.reason is None or self.reason.search(letter.reason) is not None
