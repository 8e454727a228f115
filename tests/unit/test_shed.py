"""Shedding before decoding (pipeline/batching/shed.py): which of a poll's records to
route late, given their ages and the decode cost learned from earlier polls. Pure: no
clock, no sleeps."""

from __future__ import annotations

import pytest

from pipeline.batching.shed import (
    AnswerTime,
    DecodeCost,
    StandingBacklog,
    keep_one_to_learn,
    reserve_ms,
    shed_count,
)


def test_nothing_is_shed_when_every_record_reaches_the_queue_in_time():
    assert shed_count([30.0, 20.0, 10.0], per_record_ms=1.0, horizon_ms=50.0) == 0


def test_the_oldest_are_shed_until_the_rest_fit_after_the_polls_decode():
    # Kept records are queued together after all of them are decoded: with 10 ms a
    # record, the oldest (age 40) would reach the queue at 40 + 4 * 10 = 80 > 50; the
    # next at 30 + 3 * 10 = 60 > 50; then 20 + 2 * 10 = 40 <= 50.
    assert shed_count([40.0, 30.0, 20.0, 10.0], per_record_ms=10.0, horizon_ms=50.0) == 2


def test_a_big_poll_of_fresh_records_is_cut_to_what_its_decode_leaves_time_for():
    # 1000 fresh records at 0.076 ms each (the JSON CTR codec) take 76 ms to decode:
    # with a 50 ms horizon only the newest 657 can make it (657 * 0.076 = 49.9).
    ages = [(999 - i) / 100.0 for i in range(1000)]  # oldest first: 9.99 ... 0 ms
    kept = 1000 - shed_count(ages, per_record_ms=0.076, horizon_ms=50.0)
    assert 500 < kept < 657
    oldest_kept = ages[1000 - kept]
    assert oldest_kept + kept * 0.076 <= 50.0
    assert ages[999 - kept] + (kept + 1) * 0.076 > 50.0  # one more would not fit


def test_without_a_decode_cost_only_age_beyond_the_horizon_is_shed():
    assert shed_count([60.0, 50.0, 49.0], per_record_ms=0.0, horizon_ms=50.0) == 1
    assert shed_count([], per_record_ms=5.0, horizon_ms=50.0) == 0
    assert shed_count([80.0, 70.0], per_record_ms=0.0, horizon_ms=50.0) == 2


def test_decode_cost_weighs_polls_by_their_records():
    cost = DecodeCost(decay=0.5)
    assert cost.per_record_ms == 0.0  # nothing observed: no prediction
    cost.observe(1000, 76.0)
    assert cost.per_record_ms == pytest.approx(0.076)
    cost.observe(1, 1.0)  # a one-record poll read as 1 ms on a whole-ms clock
    assert cost.per_record_ms == pytest.approx((38.0 + 1.0) / (500.0 + 1.0))
    cost.observe(0, 50.0)  # an empty poll says nothing
    assert cost.per_record_ms == pytest.approx(39.0 / 501.0)


def test_decode_cost_follows_a_slower_machine():
    cost = DecodeCost(decay=0.9)
    for _ in range(5):
        cost.observe(100, 7.6)
    for _ in range(60):
        cost.observe(100, 15.2)  # the source thread now shares its core
    assert cost.per_record_ms == pytest.approx(0.152, rel=0.01)


def test_decode_cost_refuses_a_decay_that_never_forgets_or_forgets_at_once():
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError):
            DecodeCost(decay=bad)


def test_answer_time_jumps_to_a_slow_batch_and_sinks_back_slowly() -> None:
    t = AnswerTime(decay=0.5)
    assert t.ms is None
    t.observe([])
    assert t.ms is None
    t.observe([4.0, 12.0, 7.0])  # a batch's slowest request counts
    assert t.ms == 12.0
    t.observe([2.0])
    assert t.ms == 7.0  # halfway back towards 2
    t.observe([30.0])
    assert t.ms == 30.0
    with pytest.raises(ValueError):
        AnswerTime(decay=1.0)


def test_the_reserve_is_the_learned_answer_time_capped_by_the_share_of_the_budget() -> None:
    assert reserve_ms(100.0, 0.5, None) == 50.0  # nothing answered yet: the cap
    assert reserve_ms(100.0, 0.5, 12.0) == 12.0
    assert reserve_ms(100.0, 0.5, 140.0) == 50.0  # a slow burst: never more than the cap
    assert reserve_ms(100.0, 0.0, 12.0) == 0.0  # reserve 0: only the expired are routed


def test_a_backlog_stands_once_every_poll_s_oldest_record_was_old_for_half_a_budget() -> None:
    standing = StandingBacklog()  # a 100 ms budget: 10 ms old for 50 ms
    assert standing.poll(0.0, 30.0, 100.0)  # a worker's first polls: what waited for it
    assert not standing.poll(10.0, 3.0, 100.0)  # a fresh poll: no backlog
    assert not standing.poll(20.0, 30.0, 100.0)  # old since now
    assert not standing.poll(50.0, None, 100.0)  # no timestamps: changes nothing
    assert standing.poll(70.0, 40.0, 100.0)  # old for half a budget
    assert not standing.poll(80.0, 3.0, 100.0)  # a fresh poll: the backlog is gone
    assert not standing.poll(100.0, 80.0, 100.0)  # a hiccup ages a few polls
    assert not standing.poll(120.0, 2.0, 100.0)


def test_before_anything_was_answered_one_record_of_a_poll_the_reserve_would_take_whole_is_kept() -> None:
    assert keep_one_to_learn(5, 5, answered=False) == 4
    assert keep_one_to_learn(5, 5, answered=True) == 5
    assert keep_one_to_learn(3, 5, answered=False) == 3
    assert keep_one_to_learn(0, 0, answered=False) == 0
