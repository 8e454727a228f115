"""The answer tail (pipeline/batching/tail.py): the time results take to leave after
the model, learned from the batches just published. Pure: no clock, no sleeps."""

from __future__ import annotations

import pytest

from pipeline.batching.tail import MAX_SHARE, AnswerTail


def test_nothing_is_taken_off_a_deadline_before_a_batch_was_answered() -> None:
    assert AnswerTail().ms == 0.0
    assert AnswerTail().for_budget(100.0) == 0.0


def test_the_tail_is_a_high_quantile_of_the_recent_batches_not_their_worst() -> None:
    tail = AnswerTail(window=10, quantile=0.9)
    for ms in [2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]:
        tail.observe(ms)
    assert tail.ms == 10.0  # 9 batches: the 0.9 quantile is the ceil(8.1) = 9th, the slowest
    tail.observe(250.0)  # one stalled batch (a GC pause, a first connection)
    assert tail.ms == 10.0  # 10 batches: the 9th, not the stall


def test_old_batches_leave_the_window_so_the_tail_follows_the_load_down() -> None:
    tail = AnswerTail(window=4, quantile=1.0)
    for ms in [40.0, 40.0, 40.0, 40.0]:  # overload: slow result documents
        tail.observe(ms)
    assert tail.ms == 40.0
    for ms in [3.0, 3.0, 3.0, 3.0]:  # the load has gone
        tail.observe(ms)
    assert tail.ms == 3.0


def test_the_tail_never_takes_more_than_its_share_of_a_budget() -> None:
    tail = AnswerTail(window=1)
    tail.observe(90.0)
    assert tail.for_budget(100.0) == 100.0 * MAX_SHARE
    assert tail.for_budget(1000.0) == 90.0
    tail.observe(-5.0)  # clocks read in whole ms on two threads
    assert tail.ms == 0.0


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        AnswerTail(window=0)
    with pytest.raises(ValueError):
        AnswerTail(quantile=0.0)
