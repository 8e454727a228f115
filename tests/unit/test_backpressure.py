"""Backpressure: when the source loop takes records, given the queue's rows and a clock
passed in (no sleeps). The worker acts on the decisions (pipeline/worker/core.py)."""

from __future__ import annotations

import pytest

from pipeline.batching.backpressure import Backpressure, Intake


def gate(**kw) -> Backpressure:
    return Backpressure(high_rows=100, low_rows=50, poll_records=1000, **kw)


def test_open_below_the_high_watermark_polls_a_full_batch():
    bp = gate()
    d = bp.step(99, now=0.0)
    assert d.state is Intake.OPEN and d.max_records == 1000 and not d.started_hold


def test_high_watermark_holds_intake_without_pausing_and_counts_one_episode():
    bp = gate()
    d = bp.step(100, now=0.0)
    assert d.state is Intake.HOLD and d.max_records == 0 and d.started_hold
    d = bp.step(120, now=0.01)
    assert d.state is Intake.HOLD and d.max_records == 0 and not d.started_hold
    assert bp.episodes == 1


def test_hold_is_hysteresis_between_the_watermarks():
    bp = gate()
    bp.step(100, now=0.0)
    assert bp.step(51, now=0.01).state is Intake.HOLD  # above low: still holding
    d = bp.step(50, now=0.02)
    assert d.state is Intake.OPEN and d.max_records == 1000
    assert bp.step(99, now=0.03).state is Intake.OPEN  # below high again: stays open
    assert bp.step(100, now=0.04).started_hold and bp.episodes == 2


def test_hold_trickles_one_record_per_interval_so_rebalances_are_served():
    bp = gate(trickle_interval=0.1)
    bp.step(100, now=0.0)
    takes = [bp.step(100, now=t / 100).max_records for t in range(1, 36)]  # 0.01 .. 0.35 s
    assert sum(takes) == 3  # at about 0.1, 0.2 and 0.3 s
    assert set(takes) == {0, 1}


def test_queue_that_does_not_drain_pauses_and_polls_for_events():
    bp = gate()  # stall_rows defaults to the high watermark
    bp.step(100, now=0.0)
    assert bp.step(199, now=0.2).state is Intake.HOLD
    d = bp.step(200, now=0.3)  # grew by 100 rows while holding
    # paused partitions return no records: a full poll only serves rebalances/liveness
    assert d.state is Intake.PAUSED and d.max_records == 1000
    assert bp.step(120, now=0.4).state is Intake.PAUSED  # stays paused above low
    d = bp.step(50, now=0.5)
    assert d.state is Intake.OPEN and not d.started_hold
    assert bp.episodes == 1


def test_a_poll_that_overshoots_the_high_watermark_does_not_pause():
    bp = gate()
    assert bp.step(2000, now=0.0).state is Intake.HOLD  # one big poll: 20x the mark
    assert bp.step(2000, now=0.5).state is Intake.HOLD
    assert bp.step(2099, now=1.0).state is Intake.HOLD
    assert bp.step(2100, now=1.1).state is Intake.PAUSED  # grew by stall_rows while held


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError):
        Backpressure(high_rows=10, low_rows=10, poll_records=1)
    with pytest.raises(ValueError):
        Backpressure(high_rows=10, low_rows=5, poll_records=1, stall_rows=0)
    with pytest.raises(ValueError):
        Backpressure(high_rows=10, low_rows=5, poll_records=0)
