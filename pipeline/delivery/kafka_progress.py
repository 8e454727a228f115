"""Whether the worker's writes get through to Kafka: an outage told from what the
worker itself sees, for readiness and for the log (issue 49).

A poll says nothing here: librdkafka's consume() returns an empty list as readily
with every broker gone as with no traffic, so a worker whose cluster lost quorum went
on polling "successfully" and stayed ready for 23.7 s without a result and 30 s
without a commit. What does tell is work that waits: results produced and not
acknowledged, offsets done and not committed, and a blocking client call that has not
returned (an abort at a coordinator that does not answer holds the source loop, which
then samples nothing). Each is a channel; a channel with work waiting and no success
for `stall_s` is stalled, and while one is, the worker is in an outage:

- not ready (pipeline/ops/health.py reads `stalled`), so an orchestrator sends its
  traffic elsewhere; alive all the same, since a restart fixes no outage;
- one log line when it starts, one every `report_every_s` while it lasts, and one
  when it ends, with its length and the failures counted meanwhile (a storm of the
  same failure is a count in those lines, not a line each).

An idle worker with nothing waiting is not in an outage, whatever the brokers do:
nothing of its work is held up, and its first record will tell.

Pure: the caller passes the time (time.monotonic()) and what it saw.
"""

from __future__ import annotations

from dataclasses import dataclass

DELIVERY = "delivery"
COMMIT = "commit"
CALL = "call"
CHANNELS = (DELIVERY, COMMIT, CALL)
STALL_S = 10.0  # the config's default (pipeline/config/sections.py, outage_after_s)
REPORT_EVERY_S = 10.0

_WHAT = {DELIVERY: ("no delivery acknowledged", "records waiting"), COMMIT: ("no offset commit", "partitions waiting"),
         CALL: ("", "")}


@dataclass
class _Channel:
    last_ok: float
    waiting: int = 0
    waiting_since: float | None = None
    # An exactly_once abort gives the open transaction's records and offsets up
    # unanswered; they are sent again in the next transaction
    # (pipeline/delivery/transactions.py). `owed`: they still wait, from waiting_since,
    # until the channel's next success, even while the sampled count is 0 (purged, a
    # new producer being made, the source loop held in a call). Before, each abort at
    # transaction_timeout_ms started the wait afresh, and a 20 s quorum loss never
    # reached an outage_after_s of 15 s (docs/BROKERS.md). Work that merely went away
    # (partitions revoked, all acknowledged) owes nothing: the next wait is new.
    owed: bool = False
    failures: int = 0  # since the outage began (or since the last one ended)

    def stalled_for(self, now: float) -> float | None:
        """How long work has waited without a success, if longer than nothing."""
        if (not self.waiting and not self.owed) or self.waiting_since is None:
            return None
        return now - max(self.last_ok, self.waiting_since)


class KafkaProgress:
    """Deliveries and commits getting through, or an outage. `now`: monotonic seconds."""

    def __init__(self, now: float, stall_s: float = STALL_S, report_every_s: float = REPORT_EVERY_S) -> None:
        self.stall_s = stall_s
        self.report_every_s = report_every_s
        self._channels = {name: _Channel(last_ok=now) for name in CHANNELS}
        self._call = ""  # the blocking call the source thread is in
        self._call_started = 0.0
        self._first_call = ""  # the first of the calls since the loop's last turn
        self._outage_since: float | None = None
        self._next_report = 0.0
        self.outages = 0

    # ------------------------------------------------------------------ what the worker saw
    def ok(self, channel: str, now: float) -> None:
        """A delivery was acknowledged / an offset commit succeeded."""
        ch = self._channels[channel]
        ch.last_ok, ch.owed = now, False
        if self._outage_since is None:
            ch.failures = 0  # failures that made no outage are not one's

    def failed(self, channel: str) -> None:
        """A delivery or a commit failed (counted for the outage's lines)."""
        self._channels[channel].failures += 1

    def aborted(self, owed: bool = True) -> None:
        """The open transaction was aborted. owed: its records and offsets are sent again
        in the next one, so what waited on them goes on waiting (False: every partition
        of it was let go, nothing of it is this worker's any more)."""
        for name in (DELIVERY, COMMIT):
            ch = self._channels[name]
            # From the later of its start and the last success (stalled_for): a success
            # in the same turn as the wait began was for earlier work.
            ch.owed = owed and ch.waiting_since is not None
            if not ch.owed and not ch.waiting:
                ch.waiting_since = None

    def settled(self) -> None:
        """Nothing of an aborted transaction waits any more (the next one had nothing to
        commit: its partitions were let go)."""
        self.aborted(owed=False)

    def waiting(self, channel: str, count: int, now: float) -> None:
        """`count` items wait on `channel` now (0: none)."""
        ch = self._channels[channel]
        if count and not ch.waiting and not ch.owed:  # owed: waiting_since is set (aborted())
            ch.waiting_since = now
        elif not count and not ch.owed:
            ch.waiting_since = None
        ch.waiting = count

    def in_call(self, name: str | None, started: float, now: float, *, loop: bool = True) -> None:
        """The source thread is in blocking client call `name` since `started` (None:
        in none). loop: said by the source loop itself (it is between calls: its wait
        ends); False: by the watchdog (pipeline/delivery/watchdog.py), which sees only
        the gaps between calls. Calls one after another with no loop turn between
        (flush, abort, a new producer's init_transactions, each shorter than stall_s)
        add up: the loop samples nothing meanwhile, so no other channel can tell (a
        quorum test once held it 24 s in four calls and no outage was said)."""
        ch = self._channels[CALL]
        if name is None:
            ch.waiting = 0
            if loop:
                ch.last_ok, ch.waiting_since, self._first_call = now, None, ""
            return
        if ch.waiting_since is None:
            ch.waiting_since, self._first_call = started, name
        self._call, self._call_started, ch.waiting = name, started, 1

    # ------------------------------------------------------------------ what follows
    def stalled(self, now: float) -> list[str]:
        """Why the worker's writes are held up (empty: they are not), one reason a channel."""
        return [
            self._calls_held(waited) if name == CALL else
            f"{_WHAT[name][0]} for {waited:.0f} s ({self._held(name)})"
            for name, waited in self._stalls(now)
        ]

    def _calls_held(self, waited: float) -> str:
        if self._call_started == self._channels[CALL].waiting_since:  # one call, not a run of them
            return f"Kafka call {self._call} not returned for {waited:.0f} s"
        return f"Kafka calls held the source loop for {waited:.0f} s ({self._first_call} first, now {self._call})"

    def _held(self, name: str) -> str:
        ch = self._channels[name]
        if not ch.waiting:
            return "an aborted transaction's, to be sent again"
        return f"{ch.waiting} {_WHAT[name][1]}"

    def _stalls(self, now: float) -> list[tuple[str, float]]:
        out = []
        for name, ch in self._channels.items():
            waited = ch.stalled_for(now)
            if waited is not None and waited >= self.stall_s:
                out.append((name, waited))
        return out

    @property
    def in_outage(self) -> bool:
        return self._outage_since is not None

    def step(self, now: float) -> list[str]:
        """The log lines due now: an outage's start, its reminders, its end."""
        reasons = self.stalled(now)
        if reasons and self._outage_since is None:
            self._outage_since = now - max(waited for _, waited in self._stalls(now))
            self._next_report = now + self.report_every_s
            self.outages += 1
            return [f"Kafka outage: {'; '.join(reasons)}{self._failures()}; not ready until it ends"]
        if self._outage_since is None:
            return []
        if reasons:
            if now < self._next_report:
                return []
            self._next_report = now + self.report_every_s
            return [f"Kafka outage for {now - self._outage_since:.0f} s: {'; '.join(reasons)}{self._failures()}"]
        lasted = now - self._outage_since
        line = f"Kafka outage over after {lasted:.1f} s: deliveries and commits go through again{self._failures()}"
        self._outage_since = None
        for ch in self._channels.values():
            ch.failures = 0
        return [line]

    def _failures(self) -> str:
        counts = [f"{ch.failures} {name} failures" for name, ch in self._channels.items() if ch.failures]
        return f" ({', '.join(counts)} meanwhile)" if counts else ""
