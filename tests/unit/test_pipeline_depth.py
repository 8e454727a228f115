"""Batches in flight follow the backlog (pipeline/batching/depth.py), and BatchQueue
holds a second batch back while calm. Fake clock; the one threaded test waits on
events, not on time."""

from __future__ import annotations

import threading

import pytest

from pipeline.batching.batcher import Batcher
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.depth import PipelineDepth
from pipeline.batching.policies import GreedyPolicy
from pipeline.batching.request import Request
from pipeline.clock import FakeClock


def test_backlog_from_enter_rows_back_to_calm_at_leave_rows() -> None:
    d = PipelineDepth(4, enter_rows=2048, leave_rows=512)
    assert (d.backlogged, d.in_flight) == (False, 1)
    assert not d.update(2047)
    assert d.update(2048) and (d.backlogged, d.in_flight) == (True, 4)
    assert not d.update(600)  # hysteresis: still backlogged between the marks
    assert d.update(512) and (d.backlogged, d.in_flight) == (False, 1)
    assert d.switches == 2


def test_bad_depths_are_rejected() -> None:
    with pytest.raises(ValueError):
        PipelineDepth(0, 10, 5)
    with pytest.raises(ValueError):
        PipelineDepth(2, 10, 10)


def queue_with_depth(enter_rows: int) -> BatchQueue:
    batcher = Batcher(GreedyPolicy(4), CostModel(prior=AffineCost(a=0.001, b=0.0001)))
    return BatchQueue(batcher, FakeClock(), 1000, depth=PipelineDepth(3, enter_rows, 4))


def req(i: int) -> Request:
    return Request(rows=1, arrival=0.0, deadline=10.0, item=i)


def test_calm_queue_dispatches_one_batch_at_a_time_backlogged_up_to_the_limit() -> None:
    q = queue_with_depth(enter_rows=20)
    q.put_many([req(i) for i in range(8)])
    first = q.get_batch()
    assert not q.backlogged and q.at_depth_limit  # calm: the second batch waits
    q.done(first, 0.001)
    second = q.get_batch()
    q.put_many([req(i) for i in range(8, 30)])  # 26 queued rows: a backlog
    assert not q.at_depth_limit and q.backlogged
    third, fourth = q.get_batch(), q.get_batch()
    assert q.at_depth_limit  # three in flight
    assert [b.seq for b in (first, second, third, fourth)] == [0, 1, 2, 3]


def test_an_executor_held_back_while_calm_goes_when_the_batch_before_is_done() -> None:
    q = queue_with_depth(enter_rows=100)
    q.put_many([req(i) for i in range(8)])
    first = q.get_batch()
    got: list[int] = []
    waiting = threading.Thread(target=lambda: got.append(q.get_batch().seq))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and not got  # held back, not dispatched
    q.done(first, 0.001)
    waiting.join(10)
    assert got == [1]


def wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not predicate():
            if done.wait(0.001):
                raise AssertionError(f"timed out waiting until {what}")
    finally:
        deadline.cancel()


def test_while_calm_one_executor_waits_for_requests_the_others_at_the_gate() -> None:
    """Regression: all executors waited for requests, and every poll woke them all to
    find one batch (GIL churn that doubled latency at half load)."""
    q = queue_with_depth(enter_rows=100)
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.extend(b.seq for b in iter(q.get_batch, None))) for _ in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: q._waiting_for_batch == 1, "one executor waits for requests")
    assert q._waiting_for_batch == 1  # and not three
    q.put_many([req(i) for i in range(3)])
    wait_until(lambda: got == [0], "the first batch is taken")
    assert q._busy_executors == 1 and q._waiting_for_batch == 0  # the others stay at the gate
    q.close()
    for t in threads:
        t.join(10)
    assert got == [0]
