"""Admission: polled records in, queueable requests out, every other record given its
outcome on the way (the source thread's work between a poll and the batch queue).

In order, per poll:
1. over the request size limit -> dead letter, before anything reads the value;
2. expired whatever it contains, or too old to reach the queue with the reserve of its
   budget left after its poll's decode (route_late only; pipeline/batching/shed.py)
   -> the late topic, before decoding; with tenant classes, the records of classes over
   their share go first and only they need the reserve;
3. decode -> a DecodeError (or a codec bug) is the record's dead letter; a record
   whose decode must wait for a fetch (NotReady: its writer schema) waits in the
   waiting room (waiting.py) until the fetch settles or its deadline passes, and
   `admit_waiting` takes it back;
4. a Request whose deadline is its Kafka timestamp plus its budget less the learned
   answer tail (the time results take to leave after the model, pipeline/batching/
   tail.py), on the batcher's clock (pipeline/clock.py ClockAnchor); its InFlight keeps
   the deadline itself, which its result document and late record report.

Pure but for the outcomes it is handed: the clock readings come in as arguments, so
unit tests drive it with fixed times and a fake outcomes object.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from consumers.dead_letter import record_bytes
from consumers.records import SourceRecord
from pipeline.batching.request import RULE_EXPIRED, RULE_SHED, Request
from pipeline.batching.shed import (
    DEFAULT_RESERVE,
    AnswerTime,
    DecodeCost,
    StandingBacklog,
    keep_one_to_learn,
    reserve_ms,
    shed_prefix,
)
from pipeline.batching.tail import AnswerTail
from pipeline.clock import ClockAnchor, wall_ms
from pipeline.codecs.base import Codec, Decoded, DecodeError, NotReady, decode_all
from pipeline.delivery.outcomes import decode_reason
from pipeline.worker.waiting import WaitingRoom


@dataclass(slots=True)
class InFlight:
    """What the executors and the publisher need to finish one request (its Request's item)."""

    rec: SourceRecord
    decoded: Decoded
    deadline_wall_ms: float
    consumed_wall_ms: int
    decoded_wall_ms: int = 0  # its poll was decoded (tidebatch_stage_seconds{stage="decode"}); 0: not known


class AdmissionOutcomes(Protocol):
    """The outcomes admission gives (pipeline/delivery/outcomes.py Outcomes is one)."""

    def dead_letter(
        self, rec: SourceRecord, reason: str, stage: str, *, error: BaseException | str | None = None
    ) -> None: ...

    def late(self, routed: Sequence[tuple[SourceRecord, float]], now_wall: int, rule: str) -> None: ...


class TenantStanding(Protocol):
    """What admission asks of the tenant gate before decoding a poll
    (pipeline/worker/tenant_standing.py is the worker's)."""

    def over_share(self, tenants: Sequence[str | None], now: float) -> list[bool]: ...

    def routed(self, tenants: Sequence[str | None]) -> None: ...


@dataclass(frozen=True)
class AdmissionRules:
    """What admission is configured with, decided by the composition root
    (pipeline/app/compose.py): Admission's arguments of the same names."""

    budget_ms: Callable[[int], float]
    route_expired_ms: float | None = None
    tenant_budget_ms: Callable[[str | None, int], float] | None = None
    reserve: float = DEFAULT_RESERVE
    tenants: TenantStanding | None = None
    wait_ms: float | None = None


class Admission:
    """Turns one poll's records into requests; see the module docstring for the order.

    codec: decodes values (swappable: `codec` is read on every call).
    budget_ms: a priority's latency budget in ms (the SLO of its class).
    outcomes: where dead letters and routed-late records go.
    request_bytes: the request size limit (pipeline/delivery/limits.py); the worker sets
        it again once the broker has described the topics, before its first poll.
    route_expired_ms: route records older than this many ms to the late topic without
        decoding them; None to decode everything (only set where expiry routes late).
    tenant_budget_ms: the budget by (tenant, priority) where tenant classes have SLAs of
        their own (pipeline/config/tenants.py); None: budget_ms for every tenant.
    wall: wall-clock ms, read before and after a poll is decoded (a fake one in tests).
    reserve: with route_expired_ms, the most of that budget a record must still have
        when it reaches the queue, after its poll's decode: the learned decode-to-answer
        time below it (pipeline/batching/shed.py AnswerTime); older records are routed
        late undecoded. 0: only records already expired.
    tenants: with tenant classes, each record's class standing (from the codec's
        `tenant_of` peek, pipeline/codecs/base.py); None, or a codec without the peek:
        every record needs the reserve and the oldest go first, whatever its tenant.
    wait_ms: how long after its Kafka timestamp a record may wait for its decode
        (NotReady) before it is dead-lettered: the loosest budget a request can have;
        None: the budget of priority 0.
    """

    def __init__(
        self,
        codec: Codec,
        budget_ms: Callable[[int], float],
        outcomes: AdmissionOutcomes,
        request_bytes: int,
        route_expired_ms: float | None = None,
        tenant_budget_ms: Callable[[str | None, int], float] | None = None,
        wall: Callable[[], int] = wall_ms,
        reserve: float = DEFAULT_RESERVE,
        tenants: TenantStanding | None = None,
        wait_ms: float | None = None,
    ) -> None:
        if not 0.0 <= reserve < 1.0:
            raise ValueError("reserve must be in [0, 1)")
        self.codec = codec
        self.wall = wall
        self.budget_ms = budget_ms
        self.outcomes = outcomes
        self.request_bytes = request_bytes
        self.route_expired_ms = route_expired_ms
        self.tenant_budget_ms = tenant_budget_ms
        self.anchor = ClockAnchor()
        self.reserve = reserve
        self.decode_cost = DecodeCost()
        self.answer_time = AnswerTime()  # fed by the publisher thread (worker/publisher.py)
        self.answer_tail = AnswerTail()  # likewise
        self.standing = StandingBacklog()
        self.tenants = tenants
        self.wait_ms = wait_ms
        self.waiting = WaitingRoom()

    @classmethod
    def from_rules(cls, codec: Codec, rules: AdmissionRules, outcomes: AdmissionOutcomes, request_bytes: int) -> Admission:
        """Admission as the composition root configured it (AdmissionRules)."""
        return cls(codec, rules.budget_ms, outcomes, request_bytes, rules.route_expired_ms, rules.tenant_budget_ms,
                   reserve=rules.reserve, tenants=rules.tenants, wait_ms=rules.wait_ms)

    def observe_answers(self, from_decode_ms: list[float], after_model_ms: float) -> None:
        """A batch was answered (the publisher thread calls this): each request's ms
        from its decode, and the ms from the model's end to its last result."""
        self.answer_time.observe(from_decode_ms)
        self.answer_tail.observe(after_model_ms)

    def admit(self, records: list[SourceRecord], now: float, now_wall: int) -> list[Request]:
        """The requests to queue from these records (`now` on the batcher's clock,
        `now_wall` in wall ms); every other record has had its outcome."""
        anchor = self.anchor.pair(now, now_wall)
        records = self.within_size_limit(records)
        records = self.expired_before_decoding(records, now_wall, now)
        return self.decoded(records, anchor, now, now_wall)

    def admit_waiting(self, now: float, now_wall: int) -> list[Request]:
        """The requests of waiting records whose fetch has settled; records past their
        deadline are decoded one last time, and dead-lettered if they still cannot be."""
        ready, expired = self.waiting.take(now_wall)
        if not ready and not expired:
            return []
        anchor = self.anchor.pair(now, now_wall)
        requests = self.decoded([w.rec for w in ready], anchor, now, now_wall, [w.until_wall for w in ready])
        return requests + self.decoded([w.rec for w in expired], anchor, now, now_wall, final=True)

    def decoded(self, records: list[SourceRecord], anchor: tuple[float, int], now: float, now_wall: int,
                until: list[float] | None = None, final: bool = False) -> list[Request]:
        """Decode `records`: the requests to queue; a refused record's dead letter; a
        record that must wait, parked (its deadline: `until`'s, else its timestamp plus
        wait_ms), or with `final`, dead-lettered."""
        requests: list[Request] = []
        started_wall = self.wall()
        outcomes = decode_all(self.codec, [(rec.value, rec.headers) for rec in records])
        decoded_wall = self.wall()
        self.decode_cost.observe(len(records), decoded_wall - started_wall)
        for i, (rec, decoded) in enumerate(zip(records, outcomes, strict=True)):
            if isinstance(decoded, NotReady):
                wait = self.wait_ms if self.wait_ms is not None else self.budget_ms(0)
                ts = rec.timestamp_ms if rec.timestamp_ms is not None else now_wall
                if not final and self.waiting.park(rec, decoded, until[i] if until is not None else ts + wait):
                    continue
                held = f"{self.waiting.limit} requests wait already (the most held)"
                deadline = f"within the request's deadline ({wait:.0f} ms after its timestamp)"
                decoded = DecodeError(f"{decoded} {deadline if final else held}")
            if isinstance(decoded, Exception):
                drop_traceback(decoded)  # a codec bug too: it must not kill the worker
                self.outcomes.dead_letter(rec, decode_reason(decoded), "decode", error=decoded)
                continue
            if self.tenant_budget_ms is None:
                budget = self.budget_ms(decoded.priority)
            else:
                budget = self.tenant_budget_ms(decoded.tenant, decoded.priority)
            if decoded.deadline_ms is not None:
                budget = min(budget, float(decoded.deadline_ms))  # may only tighten
            ts = rec.timestamp_ms if rec.timestamp_ms is not None else now_wall
            deadline_wall = ts + budget
            # The batcher's deadline is when the model must be done with it.
            model_by_wall = deadline_wall - self.answer_tail.for_budget(budget)
            requests.append(
                Request(
                    rows=decoded.rows,
                    arrival=now,
                    deadline=ClockAnchor.to_clock(anchor, model_by_wall),
                    due=ClockAnchor.to_clock(anchor, deadline_wall),
                    priority=decoded.priority,
                    bucket=decoded.bucket,
                    item=InFlight(rec, decoded, deadline_wall, now_wall, decoded_wall),
                    tenant=decoded.tenant,
                )
            )
        return requests

    def within_size_limit(self, records: list[SourceRecord]) -> list[SourceRecord]:
        """Dead-letter requests over the entry limit before anything else looks at
        them (pipeline/delivery/limits.py): decoding a huge value costs memory and time, and its
        copy must still fit the dead-letter topic."""
        limit = self.request_bytes
        kept: list[SourceRecord] = []
        for rec in records:
            size = record_bytes(rec.key, rec.value, list(rec.headers.items()))
            if size <= limit:
                kept.append(rec)
            else:
                reason = f"request is {size} bytes, over the {limit}-byte limit (limits.max_request_bytes)"
                self.outcomes.dead_letter(rec, reason, "admit")
        return kept

    def expired_before_decoding(self, records: list[SourceRecord], now_wall: int, now: float = 0.0) -> list[SourceRecord]:
        """Route records that will be late whatever they contain, and return the
        others. A request's own deadline_ms can only tighten the budget of its
        priority, so Kafka timestamp + the largest budget is its loosest deadline.
        Routed: records already past it, and the oldest records that would reach the
        queue, after the decode of the poll's records kept, with less than the reserve
        (`reserve_ms`) left (pipeline/batching/shed.py: shedding only the expired
        ones lets a burst's Kafka backlog age to a whole budget, and every decoded
        request is then late). Decoding is the worker's most expensive step (the model
        runs on the other core): under a backlog, decoding answers nobody waits for any
        more would starve the fresh requests behind them.

        With tenant classes (`tenants` and the codec's peek), only records of classes
        over their share need the reserve, and they go first: the reserve stands for
        the wait in the queue, and a class within its share is queued green, ahead of
        every other class's excess (pipeline/batching/tenants.py), so its record only
        has to reach the queue before its deadline; the batcher's hopeless rule still
        routes it if the model cannot make that. Without this a burster's excess and a
        steady tenant's record of the same age were shed alike, before the gate could
        tell them apart (docs/BATCHING.md, "Tenants on the real pipeline").

        The reserve applies only while a backlog stands: every poll's oldest record has
        been at least a tenth of the budget old for half of it (pipeline/batching/shed.py
        StandingBacklog). Otherwise only expired records go: a record old from a hiccup
        of the hop or the machine gets its chance."""
        if self.route_expired_ms is None:
            return records
        max_budget = self.route_expired_ms
        tight = max_budget - reserve_ms(max_budget, self.reserve, self.answer_time.ms)
        timed = [r for r in records if r.timestamp_ms is not None]
        peek = getattr(self.codec, "tenant_of", None) if self.tenants is not None else None
        tenants = [peek(r.value, r.headers) for r in timed] if peek is not None else None
        over = self.tenants.over_share(tenants, now) if self.tenants is not None and tenants is not None else None
        # Shed order: over-share classes first, then the rest; the oldest first in each.
        order = sorted(range(len(timed)), key=lambda i: (over is not None and not over[i], timed[i].timestamp_ms))
        ages = {i: now_wall - timed[i].timestamp_ms for i in order}  # type: ignore[operator]
        standing = self.standing.poll(now_wall, max(ages.values()) if ages else None, max_budget)
        # Past the loosest deadline: late whatever the decode cost (also before any
        # poll was timed).
        expired = [i for i in order if ages[i] > max_budget]
        rest = [i for i in order if ages[i] <= max_budget]
        slack = [(max_budget if over is not None and not over[i] else tight) - ages[i] for i in rest]
        # Untimed records are never routed (their age is unknown) but are decoded with
        # the rest: they count as the youngest, kept last.
        slack += [tight] * (len(records) - len(timed))
        shed = rest[: min(shed_prefix(slack, self.decode_cost.per_record_ms), len(rest))] if standing else []
        if len(timed) == len(records):  # untimed records are decoded anyway
            shed = shed[: keep_one_to_learn(len(shed), len(rest), self.answer_time.ms is not None)]
        gone = expired + shed
        if not gone:
            return records
        for rule, which in ((RULE_EXPIRED, expired), (RULE_SHED, shed)):
            if which:
                which.sort(key=lambda i: timed[i].timestamp_ms)  # type: ignore[arg-type, return-value]
                self.outcomes.late([(timed[i], timed[i].timestamp_ms + max_budget) for i in which], now_wall, rule)  # type: ignore[operator]
        if self.tenants is not None and tenants is not None:
            self.tenants.routed([tenants[i] for i in gone])
        ids = {id(timed[i]) for i in gone}
        return [r for r in records if id(r) not in ids]


def drop_traceback(exc: BaseException) -> None:
    """Forget where a refused request's exception was raised. Its traceback holds the
    decoding frames, whose locals hold the request's value, and decode_all's frame,
    which holds the list of outcomes that holds the exception: a reference cycle that
    only the cyclic collector frees, and the worker runs it rarely (runtime/
    interpreter.py). Refused 10 MB camera frames grew the heap by gigabytes that way."""
    current: BaseException | None = exc
    while current is not None:
        following = current.__cause__ or current.__context__
        current.__traceback__ = current.__context__ = current.__cause__ = None
        current = following
