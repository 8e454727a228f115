"""RequestQueue (the pure store) and BatchQueue (the worker's thread-safe face):
ordering, taking rows, watermarks, close."""

from __future__ import annotations

import threading

import pytest

from pipeline.batching.batcher import Batcher
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.policies import AdaptivePolicy, GreedyPolicy, StaticPolicy
from pipeline.batching.queue import RequestQueue
from pipeline.batching.request import REASON_DRAIN, Request
from pipeline.clock import FakeClock, MonotonicClock

COST = AffineCost(a=1e-3, b=1e-3)


def req(rows=1, arrival=0.0, deadline=10.0, prio=0, bucket=0, item=None) -> Request:
    return Request(rows=rows, arrival=arrival, deadline=deadline, priority=prio, bucket=bucket, item=item)


# ---------------------------------------------------------------------------- RequestQueue
def test_fifo_and_edf_orderings():
    fifo, edf = RequestQueue("fifo"), RequestQueue("edf")
    for i, d in enumerate([3.0, 1.0, 2.0]):
        fifo.push(req(deadline=d, item=i))
        edf.push(req(deadline=d, item=i))
    assert [r.item for r in fifo.take(0, 10)] == [0, 1, 2]
    assert [r.item for r in edf.take(0, 10)] == [1, 2, 0]
    with pytest.raises(ValueError):
        RequestQueue("lifo")  # type: ignore[arg-type]


def test_take_counts_rows_never_splits_and_always_takes_the_first():
    q = RequestQueue()
    for i, rows in enumerate([5, 4, 3]):
        q.push(req(rows=rows, item=i))
    assert q.rows == 12 and len(q) == 3
    assert [r.item for r in q.take(0, 8)] == [0]  # 5 + 4 > 8: stop, do not skip ahead
    assert [r.item for r in q.take(0, 2)] == [1]  # bigger than max: taken alone
    assert q.rows == 3 and q.bucket_rows(0) == 3


def test_take_stops_at_the_first_veto():
    q = RequestQueue()
    for i in range(5):
        q.push(req(item=i))
    taken = q.take(0, 10, fits=lambda rows_after, r: rows_after <= 3)
    assert [r.item for r in taken] == [0, 1, 2]


def test_earliest_deadline_is_the_tightened_one_not_the_edf_key():
    """EDF orders by `due`; the hold of adaptive's hold_for_efficiency must stop by the
    deadline the batcher holds (the request's less the answer tail), not by `due`."""
    q = RequestQueue("edf")
    q.push(Request(rows=1, arrival=0.0, deadline=0.6, due=1.0, item="tail grew"))
    q.push(Request(rows=1, arrival=0.0, deadline=0.8, due=0.9, item="first in EDF"))
    assert q.head(0).item == "first in EDF"
    assert q.earliest_deadline(0) == 0.6


def test_priorities_then_order_and_per_bucket_views():
    q = RequestQueue("edf")
    q.push(req(arrival=0.3, deadline=5.0, prio=1, bucket="a", item="a-low"))
    q.push(req(arrival=0.2, deadline=9.0, prio=0, bucket="a", item="a-high"))
    q.push(req(arrival=0.1, deadline=1.0, prio=0, bucket="b", item="b"))
    assert q.head("a").item == "a-high"
    assert q.oldest_arrival("a") == 0.2 and q.earliest_deadline("a") == 5.0
    assert set(q.buckets()) == {"a", "b"}
    assert [r.item for r in q.take("a", 10)] == ["a-high", "a-low"]
    assert q.buckets() == ["b"] and q.head("a") is None


def test_pop_while_removes_from_the_top_of_each_priority():
    q = RequestQueue("edf")
    for d in (1.0, 2.0, 3.0):
        q.push(req(deadline=d, prio=0))
        q.push(req(deadline=d, prio=1))
    out = q.pop_while(0, lambda r: r.deadline < 2.5)
    assert sorted((r.priority, r.deadline) for r in out) == [(0, 1.0), (0, 2.0), (1, 1.0), (1, 2.0)]
    assert len(q) == 2


def test_a_zero_row_request_does_not_become_invisible():
    q = RequestQueue()
    q.push(req(rows=0, item="empty"))
    assert q.buckets() == [0] and [r.item for r in q.drain()] == ["empty"]


# ---------------------------------------------------------------------------- BatchQueue
def queue(policy=None, clock=None, **kw) -> BatchQueue:
    batcher = Batcher(policy or GreedyPolicy(64), CostModel(prior=COST), rate_half_life=1e3)
    return BatchQueue(batcher, clock or FakeClock(), **kw)


def test_watermarks_pause_at_high_and_resume_at_low():
    q = queue(GreedyPolicy(4), high_watermark_rows=10, low_watermark_rows=4)
    for _ in range(9):
        q.put(req())
    assert not q.above_high_watermark() and not q.below_low_watermark()
    q.put(req())
    assert q.above_high_watermark()
    q.get_batch()  # 4 rows out: 6 left, between the marks (hysteresis)
    assert not q.above_high_watermark() and not q.below_low_watermark()
    q.get_batch()
    assert q.below_low_watermark() and q.backpressure_rows == 2


def test_default_low_watermark_is_half_and_bad_marks_are_rejected():
    q = queue(high_watermark_rows=100)
    assert q.low_watermark_rows == 50
    with pytest.raises(ValueError):
        queue(high_watermark_rows=0)
    with pytest.raises(ValueError):
        queue(high_watermark_rows=10, low_watermark_rows=10)


def test_late_lane_rows_do_not_hold_consumption_back_while_in_time_work_waits():
    q = queue(AdaptivePolicy(64), high_watermark_rows=10)
    q.batcher.expiry_action = "score_late"
    q.put(req(rows=1, deadline=60.0))  # fresh work that can still make it
    for _ in range(20):
        q.put(req(rows=1, deadline=0.0005))  # hopeless on arrival
    assert q.rows == 21 and q.backpressure_rows == 1
    assert not q.above_high_watermark()


def test_a_backlog_of_late_work_alone_holds_intake_instead_of_overflowing_the_late_lane():
    # A backlog drain with a decoder faster than the model: everything arriving is
    # late and nothing in time waits. Before, the watermarks saw 0 rows, intake never
    # held, and beyond max_late_rows requests were routed unscored under score_late.
    q = queue(AdaptivePolicy(64), high_watermark_rows=10)
    q.batcher.expiry_action = "score_late"
    q.batcher.max_late_rows = 15
    for _ in range(10):
        q.put(req(rows=1, deadline=0.0005))
    assert q.backpressure_rows == 10 and q.above_high_watermark()
    assert q.pop_routed_late() == []


def test_done_feeds_the_cost_model_and_routed_requests_come_out_once():
    q = queue(AdaptivePolicy(64))
    q.batcher.expiry_action = "route_late"
    q.put(req(item="ok"))
    q.put(req(deadline=0.0005, item="late"))
    batch = q.get_batch()
    q.done(batch, 0.002)
    assert q.batcher.cost.observations(0) == 1
    assert [r.item for r in q.pop_routed_late()] == ["late"] and q.pop_routed_late() == []


def test_close_flushes_what_a_linger_would_hold_then_returns_none():
    q = queue(StaticPolicy(max_batch_rows=64, max_queue_delay=60.0))
    for i in range(3):
        q.put(req(item=i))
    q.close()  # the fake clock never moves: a linger wait would hang this test
    batch = q.get_batch()
    assert [r.item for r in batch.requests] == [0, 1, 2] and batch.reason == REASON_DRAIN
    assert q.get_batch() is None


def test_executor_thread_gets_batches_and_exits_on_close():
    q = queue(GreedyPolicy(64), clock=MonotonicClock())
    got: list = []

    def executor() -> None:
        while (batch := q.get_batch()) is not None:
            got.append([r.item for r in batch.requests])
            q.done(batch, 0.0)

    t = threading.Thread(target=executor, daemon=True)
    t.start()
    q.put_many([req(item=0), req(item=1)])
    q.close()
    t.join(timeout=5.0)
    assert not t.is_alive()
    assert sorted(i for b in got for i in b) == [0, 1]


def test_dispatched_batches_are_numbered_in_order_drain_batches_too():
    """The worker publishes in this order when several batches are in flight."""
    q = queue(GreedyPolicy(2))
    for i in range(6):
        q.put(req(item=i))
    assert [q.get_batch().seq for _ in range(2)] == [0, 1]
    q.close()
    assert q.get_batch().seq == 2 and q.get_batch() is None
