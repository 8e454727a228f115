"""`tidebatch dlq replay`: send the requests of selected dead letters to a topic again,
after a fix, at a bounded rate, and never send one dead letter twice.

What a replay sends is the request as the worker received it: the dead letter's value,
key and the request's own headers (consumers/dead_letter.py puts them first and its
own after; pipeline/dlq/letters.py strips ours), plus `tidebatch.replayed.from`. It
gets a new timestamp: with the old one, a worker would find it long past its deadline
and route it late. A dead letter that was cut to fit its topic (`tidebatch.truncated`)
is not the request any more: it is counted, never sent.

Why a ledger and not a consumer group's committed offset: an offset is a watermark, so
a replay of `--reason A` would commit past the `B` records it skipped, and a later
`--reason B` run would never see them. The ledger topic (`<dlq topic>.replayed`, one
partition) holds one record per replayed dead letter, keyed by its partition/offset;
each run reads it first and skips what it lists, whatever the selection of the run
that replayed it. It is written only after the replayed records are durable
(flush, then ledger -- as the worker's sinks flush before offsets commit,
pipeline/delivery/partitions.py), so the ledger never lists a record that was not sent.
A crash between the two leaves up to CHUNK records (at most CHUNK_S seconds of them)
sent but not listed: the next run sends those again. That is the only duplication:
at-least-once, and a worker with Redis dedup (docs/OPERATIONS.md) drops the repeats
by request id.

A replayed request that fails again is a new dead letter, which no ledger lists; it
carries the replay's `tidebatch.replayed.from` (consumers/dead_letter.py keeps it), so
it is skipped as having come back: a periodic replay of a request that can never pass
would otherwise send it again on every run. `--again` sends those too (and ignores the
ledger), each request once a run however often it came back (`tidebatch.replayed.origin`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from consumers.records import SendError
from pipeline.clock import wall_ms
from pipeline.dlq.letters import DeadLetter, Selection
from pipeline.dlq.read import read_topic, topic_exists
from pipeline.errors import UserError
from pipeline.kafka_backend import confluent_producer

CHUNK = 500  # records between ledger checkpoints, at most
CHUNK_S = 1.0  # seconds between ledger checkpoints, at most
_FLUSH_S = 30.0


def ledger_topic(dlq_topic: str) -> str:
    return f"{dlq_topic}.replayed"


def ledger_key(letter: DeadLetter) -> str:
    return f"{letter.partition}/{letter.offset}"


@dataclass
class ReplayReport:
    selected: int = 0  # matched the selection
    replayed: int = 0  # sent (or, with --dry-run, would be)
    already: int = 0  # listed in the ledger: replayed by an earlier run
    came_back: int = 0  # a replayed request that failed again: skipped without --again
    same_request: int = 0  # --again: another dead letter of a request this run sent
    truncated: int = 0  # cut to fit the dead-letter topic: cannot be replayed

    def line(self, to_topic: str, dry_run: bool) -> str:
        verb = "would replay" if dry_run else "replayed"
        parts = [f"{verb} {self.replayed} of {self.selected} selected dead letters to {to_topic}"]
        if self.already:
            parts.append(f"{self.already} already replayed by an earlier run (skipped)")
        if self.came_back:
            parts.append(f"{self.came_back} came back from an earlier replay, failed again (skipped; --again sends them)")
        if self.same_request:
            parts.append(f"{self.same_request} of a request sent once already in this run (skipped)")
        if self.truncated:
            parts.append(f"{self.truncated} truncated to fit the dead-letter topic: cannot be replayed")
        return "; ".join(parts)


@dataclass(frozen=True)
class ReplayJob:
    bootstrap: str
    profile: str
    dlq_topic: str
    to_topic: str
    selection: Selection
    rate: float  # records per second, > 0
    dry_run: bool = False
    again: bool = False  # ignore the ledger (replay what was replayed before too)
    consumer_settings: Mapping[str, Any] | None = None
    producer_settings: Mapping[str, Any] | None = None
    admin_settings: Mapping[str, Any] | None = None


def replay(job: ReplayJob, *, clock: Callable[[], float] = time.monotonic) -> ReplayReport:
    """Replay the selected dead letters of job.dlq_topic (up to the end it had at the
    start) to job.to_topic; raises UserError, after listing what was delivered, when
    Kafka did not take a record."""
    report = ReplayReport()
    ledger = ledger_topic(job.dlq_topic)
    done = set() if job.again else read_ledger(job, ledger)
    if not job.dry_run and not topic_exists(job.bootstrap, job.profile, job.to_topic, job.consumer_settings):
        raise UserError(f"topic {job.to_topic!r} not found: replay sends to an existing topic only (a typo would create one)")
    sender = None if job.dry_run else _Sender(job, ledger)
    t0 = clock()
    letters = read_topic(job.bootstrap, job.profile, job.dlq_topic, since_ms=job.selection.since_ms, settings=job.consumer_settings)
    for letter in chosen(letters, job.selection, done, job.again, report):
        if sender is not None:
            wait = t0 + (report.replayed - 1) / job.rate - clock()
            sender.send(letter, max(wait, 0.0))
    if sender is not None:
        sender.checkpoint()
    return report


def chosen(
    letters: Iterable[DeadLetter], selection: Selection, done: set[str], again: bool, report: ReplayReport
) -> Iterator[DeadLetter]:
    """The dead letters to send, counting in `report` what was selected and why the
    rest was skipped (pure): listed in the ledger `done`; came back from a replay
    (unless `again`); truncated; or a request this run sends already."""
    sent: set[str] = set()  # origins: one request is sent once a run
    for letter in letters:
        if not selection.matches(letter):
            continue
        report.selected += 1
        if ledger_key(letter) in done:
            report.already += 1
        elif letter.replayed_from is not None and not again:
            report.came_back += 1
        elif letter.truncated is not None:
            report.truncated += 1
        elif letter.origin in sent:
            report.same_request += 1
        else:
            sent.add(letter.origin)
            report.replayed += 1
            yield letter


def read_ledger(job: ReplayJob, ledger: str) -> set[str]:
    if not topic_exists(job.bootstrap, job.profile, ledger, job.consumer_settings):
        return set()
    return {r.key.decode() for r in read_topic(job.bootstrap, job.profile, ledger, settings=job.consumer_settings) if r.key}


class _Sender:
    """Sends replayed records and, once they are durable, their ledger entries."""

    def __init__(self, job: ReplayJob, ledger: str) -> None:
        from consumers.admin import ensure_topics

        self.job, self.ledger = job, ledger
        ensure_topics(job.bootstrap, {ledger: 1}, admin_config=job.admin_settings)
        # Idempotent (the profile's default): librdkafka's retries write no duplicates.
        self.producer = confluent_producer(job.profile, job.bootstrap, job.producer_settings)
        self.sent: list[DeadLetter] = []
        self.failed: list[str] = []
        self.recorded = 0
        self.last_checkpoint = time.monotonic()

    def send(self, letter: DeadLetter, wait_s: float) -> None:
        # The rate bound, serving delivery reports meanwhile. poll() returns as soon as
        # it served one, so it is called until the time is up.
        until = time.monotonic() + wait_s
        while (left := until - time.monotonic()) > 0:
            self.producer.poll(left)

        def delivered(err: SendError | None, letter: DeadLetter = letter) -> None:
            if err is None:
                self.sent.append(letter)
            else:
                self.failed.append(f"{letter.where}: {err.reason}")

        self.producer.send(self.job.to_topic, letter.key, letter.value, letter.replay_headers(), delivered)
        if len(self.sent) >= CHUNK or time.monotonic() - self.last_checkpoint >= CHUNK_S:
            self.checkpoint()

    def checkpoint(self) -> None:
        """Replayed records durable first, then their ledger entries."""
        self._flush("replayed records to " + self.job.to_topic)
        done, self.sent = self.sent, []
        ledger_errors: list[str] = []
        for letter in done:
            value = json.dumps({"to": self.job.to_topic, "replayed_at_ms": wall_ms(), "reason": letter.reason[:200]})
            self.producer.send(
                self.ledger, ledger_key(letter).encode(), value.encode(), None,
                lambda err: err is None or ledger_errors.append(err.reason),
            )
        self._flush("the ledger " + self.ledger)
        if ledger_errors:
            raise UserError(
                f"{len(ledger_errors)} replayed records could not be listed in {self.ledger} "
                f"({ledger_errors[0]}): a rerun sends them again"
            )
        self.recorded += len(done)
        self.last_checkpoint = time.monotonic()
        if self.failed:
            raise UserError(
                f"{len(self.failed)} records were not delivered to {self.job.to_topic} (first: {self.failed[0]}); "
                "rerun the same command to send them"
            )

    def _flush(self, what: str) -> None:
        left = self.producer.flush(_FLUSH_S)
        if left:
            raise UserError(f"{left} records not acknowledged within {_FLUSH_S:g} s writing {what}; rerun to resume")
