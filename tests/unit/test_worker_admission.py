"""The worker's admission (pipeline/worker/admission.py) without Kafka: refused records
get their one outcome, expired ones are routed, the shed reserve, deadlines; with fake
outcomes and a fake codec (tests/unit/worker_fakes.py); clock readings are passed in,
nothing sleeps."""

from __future__ import annotations

import pytest

from pipeline.worker.admission import Admission, InFlight
from tests.unit.worker_fakes import WALL, FakeOutcomes, ToyCodec, record


def admission(outcomes: FakeOutcomes, codec: ToyCodec, *, limit: int = 1000, route_ms: float | None = None) -> Admission:
    return Admission(codec, lambda priority: 100.0, outcomes, limit, route_ms)


def in_a_burst(adm: Admission, now_wall: int, answered_ms: float | None = 50.0) -> Admission:
    """Polls' records have been old for half a budget before `now_wall` (a backlog
    stands: pipeline/batching/shed.py StandingBacklog) and, unless None, batches took
    `answered_ms` from decode to answer (the reserve, up to half the budget)."""
    adm.standing.poll(now_wall - 100, 100.0, 100.0)
    if answered_ms is not None:
        adm.answer_time.observe([answered_ms])
    return adm


def test_admission_gives_every_refused_record_its_one_outcome_and_queues_the_rest() -> None:
    outcomes, codec = FakeOutcomes(), ToyCodec()
    records = [record(0, b"r0"), record(1, b"x" * 2000), record(2, b"bad"), record(3, b"crash"), record(4, b"r4")]
    requests = admission(outcomes, codec).admit(records, now=10.0, now_wall=WALL + 5)
    assert [r.item.rec.offset for r in requests] == [0, 4]
    assert [(o, s) for o, _, s in outcomes.dead] == [(1, "admit"), (2, "decode"), (3, "decode")]
    assert "over the 1000-byte limit" in outcomes.dead[0][1]
    assert outcomes.dead[1][1] == "field 'x' is missing"
    assert outcomes.dead[2][1] == "decoder crashed: ZeroDivisionError: oops"
    assert b"x" * 2000 not in codec.decoded  # never decoded


def test_admission_routes_expired_records_without_decoding_them_only_when_asked() -> None:
    old = record(0, b"r0", ts=WALL - 500)
    fresh = record(1, b"r1", ts=WALL - 50)
    outcomes, codec = FakeOutcomes(), ToyCodec()
    requests = admission(outcomes, codec, route_ms=200.0).admit([old, fresh], now=1.0, now_wall=WALL)
    assert [r.item.rec.offset for r in requests] == [1]
    assert outcomes.routed == [(0, WALL - 500 + 200.0)] and outcomes.rules == ["expired"]
    assert codec.decoded == [b"r1"]
    # Without route_expired_ms (expiry scores late, or a policy without a late lane): decoded.
    outcomes, codec = FakeOutcomes(), ToyCodec()
    requests = admission(outcomes, codec).admit([old, fresh], now=1.0, now_wall=WALL)
    assert len(requests) == 2 and outcomes.routed == []


def test_admission_routes_records_too_old_to_be_answered_after_their_polls_decode() -> None:
    """A burst's backlog reaches the worker first in first out: records that would reach
    the queue with less than the reserve (half) of their budget left, after the decode
    of the poll's records kept, are routed late undecoded, oldest first, so the ones
    decoded still have time to be answered (pipeline/batching/shed.py)."""
    walls = iter([WALL, WALL + 10, WALL + 100, WALL + 100])  # before/after each decode
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, wall=lambda: next(walls))
    adm.admit([record(i, b"r%d" % i, ts=WALL - 1) for i in range(10)], now=1.0, now_wall=WALL)
    assert adm.decode_cost.per_record_ms == pytest.approx(1.0)  # 10 records in 10 ms
    in_a_burst(adm, WALL + 100)
    # Ages 70, 45, 38, 20 ms, then one without a timestamp; 1 ms a record to decode.
    poll = [record(10, b"r10", ts=WALL + 100 - 20), record(11, b"r11", ts=WALL + 100 - 70),
            record(12, b"r12", ts=WALL + 100 - 45), record(13, b"r13", ts=None), record(14, b"r14", ts=WALL + 100 - 38)]
    codec.decoded.clear()
    requests = adm.admit(poll, now=1.1, now_wall=WALL + 100)
    # Age 70 > 50 alone; age 45 + 4 records' decode = 49 <= 50 fits.
    assert [o for o, _ in outcomes.routed] == [11]
    assert outcomes.rules == ["shed"]  # within its budget, but too old to keep the reserve
    assert outcomes.routed[0][1] == WALL + 100 - 70 + 100.0  # its loosest deadline
    assert sorted(r.item.rec.offset for r in requests) == [10, 12, 13, 14]
    assert b"r11" not in codec.decoded


def test_admission_keeps_only_the_learned_answer_time_in_reserve() -> None:
    """Once batches were answered in at most 10 ms after their decode, a record needs
    10 ms of its budget left when it reaches the queue, not half of it: at 50 % load
    on a busy machine the fixed half routed records 50-100 ms old that would have made
    it (pipeline/batching/shed.py AnswerTime)."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = in_a_burst(Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0), WALL, None)
    adm.answer_time.observe([6.0, 10.0])
    poll = [record(0, b"r0", ts=WALL - 95), record(1, b"r1", ts=WALL - 85), record(2, b"r2", ts=WALL - 60)]
    requests = adm.admit(poll, now=1.0, now_wall=WALL)
    assert [o for o, _ in outcomes.routed] == [0]  # 95 > 90; 85 and 60 would have been routed at 50
    assert outcomes.rules == ["shed"]
    assert [r.item.rec.offset for r in requests] == [1, 2]


def test_admission_sheds_on_the_reserve_only_while_a_backlog_stands() -> None:
    """Records old from a hiccup of the hop or the machine, with fresh polls between
    them: shedding them buys nobody decode time. At 50 % load on Apache Kafka the
    reserve routed 10-145 requests a run, in 3 of 10 runs, that greedy answered in
    time; now only the expired go until every poll has been old for half a budget."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0)
    adm.answer_time.observe([30.0])  # the reserve: 30 ms
    adm.admit([record(0, b"r0", ts=WALL - 3)], now=1.0, now_wall=WALL)  # a fresh poll
    at = WALL + 20  # a hiccup: this poll's records are 85 and 120 ms old
    requests = adm.admit([record(1, b"r1", ts=at - 120), record(2, b"r2", ts=at - 85)], now=1.02, now_wall=at)
    assert outcomes.rules == ["expired"] and [r.item.rec.offset for r in requests] == [2]
    at = WALL + 70  # every poll old since WALL + 20: a backlog stands; the reserve applies
    requests = adm.admit([record(3, b"r3", ts=at - 85), record(4, b"r4", ts=at - 15)], now=1.07, now_wall=at)
    assert outcomes.rules == ["expired", "shed"] and [o for o, _ in outcomes.routed] == [1, 3]
    assert [r.item.rec.offset for r in requests] == [4]


def test_a_long_hop_does_not_keep_the_worker_from_ever_answering() -> None:
    """Every record arrives 70 ms old, a backlog to admission's eyes. The reserve is
    half the budget until a batch was answered: every record was shed on it, none was
    ever answered and the reserve never learned, so every request routed late, for good.
    Now, before anything was answered, the reserve never takes a whole poll."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0)
    for i in range(10):
        assert len(adm.admit([record(i, b"r", ts=WALL + 10 * i - 70)], now=1.0, now_wall=WALL + 10 * i)) == 1
    assert outcomes.routed == []


def test_the_batcher_gets_each_deadline_less_the_learned_answer_tail() -> None:
    """Results leave a while after the model ends (result documents and sends on the
    publisher thread): the batcher must have the model done by then, or the answer is
    late after all its work was paid for (at 120 % of capacity adaptive scored 5610
    requests late for 6664 in time). Its result and late record still report the
    deadline itself (pipeline/batching/tail.py)."""
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = admission(outcomes, codec)
    before = adm.admit([record(0, b"r0", ts=WALL - 20)], now=1.0, now_wall=WALL)[0]
    assert before.deadline == pytest.approx(1.0 + 0.080)  # nothing answered yet: the deadline itself
    adm.observe_answers([30.0], 12.0)
    after = adm.admit([record(1, b"r1", ts=WALL - 20)], now=1.0, now_wall=WALL)[0]
    assert after.deadline == pytest.approx(1.0 + 0.080 - 0.012)
    assert after.due == before.due == pytest.approx(1.0 + 0.080)  # EDF's order: its own deadline
    assert after.item.deadline_wall_ms == before.item.deadline_wall_ms == WALL + 80
    adm.observe_answers([30.0], 500.0)  # a stalled publisher takes at most half a budget
    for _ in range(40):
        adm.observe_answers([30.0], 500.0)
    assert adm.admit([record(2, b"r2", ts=WALL - 20)], now=1.0, now_wall=WALL)[0].deadline == pytest.approx(1.0 + 0.030)


def test_admission_with_no_reserve_routes_only_records_already_expired() -> None:
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, reserve=0.0)
    poll = [record(0, b"r0", ts=WALL - 101), record(1, b"r1", ts=WALL - 95), record(2, b"r2", ts=WALL - 60)]
    requests = adm.admit(poll, now=1.0, now_wall=WALL)
    assert [o for o, _ in outcomes.routed] == [0]
    assert [r.item.rec.offset for r in requests] == [1, 2]
    with pytest.raises(ValueError):
        Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, reserve=1.0)


def test_admission_never_routes_a_record_without_a_timestamp_however_slow_decoding_is() -> None:
    walls = iter([WALL, WALL + 500, WALL + 500, WALL + 500])
    outcomes, codec = FakeOutcomes(), ToyCodec()
    adm = Admission(codec, lambda priority: 100.0, outcomes, 1000, 100.0, wall=lambda: next(walls))
    adm.admit([record(0, b"r0", ts=None)], now=1.0, now_wall=WALL)  # 500 ms for one record
    in_a_burst(adm, WALL + 500)
    requests = adm.admit([record(1, b"r1", ts=None), record(2, b"r2", ts=WALL + 480)], now=1.5, now_wall=WALL + 500)
    assert [o for o, _ in outcomes.routed] == [2]
    assert [r.item.rec.offset for r in requests] == [1]


def test_admission_deadline_is_timestamp_plus_budget_tightened_by_the_request() -> None:
    adm = admission(FakeOutcomes(), ToyCodec())
    a, b, c = adm.admit([record(0, b"r0"), record(1, b"d30"), record(2, b"r2", ts=None)], now=50.0, now_wall=WALL + 10)
    infs: list[InFlight] = [a.item, b.item, c.item]
    assert [i.deadline_wall_ms for i in infs] == [WALL + 100.0, WALL + 30.0, WALL + 10 + 100.0]
    # On the batcher's clock: now_wall maps to now.
    assert a.deadline == pytest.approx(50.0 + 0.090)
    assert b.deadline == pytest.approx(50.0 + 0.020)
    assert c.deadline == pytest.approx(50.0 + 0.100)
    assert all(i.consumed_wall_ms == WALL + 10 for i in infs)


def test_admission_stamps_when_each_poll_was_decoded() -> None:
    """The decode stage's end (tidebatch_stage_seconds{stage="decode"}): the wall clock
    read once the whole poll is decoded, the same for every request of that poll."""
    clock = iter([WALL + 1, WALL + 7, WALL + 11, WALL + 19])  # before and after each decode
    adm = Admission(ToyCodec(), lambda priority: 100.0, FakeOutcomes(), 1 << 20, wall=lambda: next(clock))
    first = adm.admit([record(0, b"r0"), record(1, b"r1")], now=1.0, now_wall=WALL)
    second = adm.admit([record(2, b"r2")], now=1.01, now_wall=WALL + 10)
    assert [(r.item.consumed_wall_ms, r.item.decoded_wall_ms) for r in first + second] == [
        (WALL, WALL + 7), (WALL, WALL + 7), (WALL + 10, WALL + 19)]


def test_equal_timestamps_admitted_in_different_polls_get_equal_deadlines() -> None:
    """The anchor stays fixed: whole-ms wall readings that truncate differently in two
    polls must not reorder equal timestamps under EDF (pipeline/clock.py ClockAnchor)."""
    adm = admission(FakeOutcomes(), ToyCodec())
    (first,) = adm.admit([record(0, b"r0")], now=100.0009, now_wall=WALL)
    (second,) = adm.admit([record(1, b"r1")], now=100.0101, now_wall=WALL + 10)
    assert first.deadline == second.deadline
    # A wall-clock step (the clocks drift apart by more than 20 ms) re-anchors.
    (third,) = adm.admit([record(2, b"r2")], now=100.02, now_wall=WALL + 1000)
    assert third.deadline == pytest.approx(100.02 + (WALL + 100 - (WALL + 1000)) / 1000.0)
