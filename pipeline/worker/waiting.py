"""Records whose decode must wait: their codec is fetching something they need (a
writer schema from the schema registry: pipeline/codecs/schema_wire.py raises NotReady,
pipeline/registry/schema_fetch.py fetches it on a thread of its own).

The source thread parks such a record here instead of waiting for the fetch itself,
so that every other record, those of known schemas included, goes on being decoded
and scored while the registry is slow or down. Each turn of the source loop
(admission.py `admit_waiting`) takes back the records whose fetch has settled (their
decode now gives a request or a dead letter) and those past their deadline (the
record's Kafka timestamp plus the loosest budget a request can have) whose fetch has
failed (no answer, or an error: NotReady.failing): one last decode, and if it still
cannot be decoded, the record's dead letter with the reason. A fetch that is only slow
(its first attempt in flight, bounded by the client's timeout) is waited for past the
deadline, up to GRACE_MS more: a new schema id mid-stream is a fetch of some ms, and
its requests are late, not lost (a worker that routes late requests does so after the
decode). Every record leaves with one outcome; a parked one holds its partition's
commit back (its offset is not done), as a queued request does.

At most `limit` records wait; a record beyond that is refused at once (dead-lettered
with the reason) rather than held in memory for a registry that may not come back.
Pure: the caller passes the wall clock's reading.
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.records import SourceRecord
from pipeline.codecs.base import NotReady

MAX_WAITING = 20_000
GRACE_MS = 30_000  # past its deadline, how long a record waits for a fetch that has not failed


@dataclass(slots=True)
class Waiting:
    rec: SourceRecord
    reason: NotReady  # the last decode's: its ready() and its reason
    until_wall: float  # its deadline, wall ms


class WaitingRoom:
    def __init__(self, limit: int = MAX_WAITING) -> None:
        self.limit = limit
        self._waiting: list[Waiting] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def park(self, rec: SourceRecord, reason: NotReady, until_wall: float) -> bool:
        """Hold `rec` until its decode may succeed or `until_wall`; False (not held)
        when `limit` records wait already."""
        if len(self._waiting) >= self.limit:
            return False
        self._waiting.append(Waiting(rec, reason, until_wall))
        return True

    def take(self, now_wall: float) -> tuple[list[Waiting], list[Waiting]]:
        """(the records to decode again: their wait has settled; the records past their
        deadline), both in the order they came; the rest keep waiting."""
        ready: list[Waiting] = []
        expired: list[Waiting] = []
        kept: list[Waiting] = []
        for w in self._waiting:
            if w.until_wall <= now_wall and (w.until_wall + GRACE_MS <= now_wall or w.reason.failing()):
                expired.append(w)
            elif w.reason.ready():
                ready.append(w)
            else:
                kept.append(w)
        self._waiting = kept
        return ready, expired
