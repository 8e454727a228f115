"""The Batcher's own rules: the late lane and its share, expiry actions, the late
lane's bound, backpressure rows, drain. Fake time only."""

from __future__ import annotations

import pytest

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.policies import AdaptivePolicy, GreedyPolicy, StaticPolicy
from pipeline.batching.request import REASON_DRAIN, REASON_LATE, Request

# t(n) = 1 ms + 1 ms/row
COST = AffineCost(a=1e-3, b=1e-3)


def req(rows: int = 1, deadline: float = 10.0, prio: int = 0, bucket=0, item=None) -> Request:
    return Request(rows=rows, arrival=0.0, deadline=deadline, priority=prio, bucket=bucket, item=item)


def adaptive(**kw) -> Batcher:
    kw.setdefault("rate_half_life", 1e3)  # light load: early drop stays out of these tests
    return Batcher(AdaptivePolicy(max_batch_rows=4), CostModel(prior=COST), **kw)


def hopeless(rows: int = 1, item=None) -> Request:
    return req(rows=rows, deadline=0.0005, item=item)  # t(1) = 2 ms > 0.5 ms


def test_score_late_keeps_hopeless_requests_in_the_late_lane_and_scores_them_after():
    b = adaptive(expiry_action="score_late")
    b.add(hopeless(item="late"), 0.0)
    b.add(req(item="ok"), 0.0)
    assert b.late_rows == 1 and b.backpressure_rows == 1 and b.rows == 2
    assert b.pop_routed_late() == []
    first, second = b.next_batch(0.0), b.next_batch(0.0)
    assert [r.item for r in first.requests] == ["ok"] and not first.late
    assert [r.item for r in second.requests] == ["late"]
    assert second.late and second.reason == REASON_LATE
    assert b.next_batch(0.0) is None


def test_route_late_hands_hopeless_requests_over_exactly_once():
    b = adaptive(expiry_action="route_late")
    b.add(hopeless(item="a"), 0.0)
    b.add(hopeless(item="b"), 0.0)
    assert b.late_rows == 0 and len(b) == 0 and b.routed_pending == 2
    routed = b.pop_routed_late()
    assert [r.item for r in routed] == ["a", "b"] and all(r.late for r in routed)
    assert b.pop_routed_late() == [] and b.routed_pending == 0
    assert b.next_batch(0.0) is None


def test_a_routed_request_names_the_rule_that_routed_it():
    """Predicted to miss (hopeless) and already past its deadline (overdue) are told
    apart, on arrival and in the sweep at dispatch: the late record's header and
    tidebatch_routed_late_total say which rule a policy's losses come from (issue 26)."""
    b = adaptive(expiry_action="route_late")
    b.add(hopeless(item="predicted"), 0.0)
    b.add(req(deadline=-0.001, item="past"), 0.0)
    b.add(req(deadline=0.004, item="swept"), 0.0)  # t(1) = 2 ms: in time on arrival
    assert b.next_batch(0.005) is None  # by then past its deadline
    assert [(r.item, r.late_rule) for r in b.pop_routed_late()] == [
        ("predicted", "hopeless"), ("past", "overdue"), ("swept", "overdue")]


def test_the_late_lane_bound_overflows_to_routed():
    b = adaptive(expiry_action="score_late", max_late_rows=5)
    for i in range(4):
        b.add(hopeless(rows=2, item=i), 0.0)
    assert b.late_rows == 4  # 0 and 1 fit in 5 rows
    assert [r.item for r in b.pop_routed_late()] == [2, 3]


def test_late_share_gives_the_late_lane_its_share_while_in_time_work_waits():
    b = adaptive(expiry_action="score_late", late_share=0.25)
    for i in range(100):
        b.add(hopeless(item=("late", i)), 0.0)
    late_rows = in_time_rows = 0
    for i in range(200):
        b.add(req(item=("ok", i)), 0.0)
        batch = b.next_batch(0.0)
        if batch.late:
            late_rows += batch.rows
        else:
            in_time_rows += batch.rows
    assert late_rows / (late_rows + in_time_rows) == pytest.approx(0.25, abs=0.03)


def test_late_share_zero_still_serves_the_late_lane_when_the_executor_would_idle():
    b = adaptive(expiry_action="score_late", late_share=0.0)
    b.add(hopeless(item="late"), 0.0)
    b.add(req(item="ok"), 0.0)
    assert not b.next_batch(0.0).late
    assert b.next_batch(0.0).late  # nothing in time left: work-conserving


def test_late_share_does_not_bank_credit_during_a_calm_spell():
    b = adaptive(expiry_action="score_late", late_share=0.5)
    for _ in range(1000):  # a long calm spell with no late work
        b.add(req(), 0.0)
        assert not b.next_batch(0.0).late
    for i in range(6):
        b.add(hopeless(item=("late", i)), 0.0)
    kinds = []
    for _ in range(6):
        b.add(req(), 0.0)
        kinds.append(b.next_batch(0.0).late)
    # In-time work first, then alternating by share — not six late batches in a row.
    assert kinds[0] is False and kinds.count(True) <= 3


def test_backpressure_counts_in_time_rows_while_any_wait_else_the_late_lane():
    b = adaptive(expiry_action="score_late")
    b.add(hopeless(rows=3), 0.0)
    assert b.backpressure_rows == 3  # only late work: a backlog drain, intake may hold
    b.add(req(rows=2), 0.0)
    assert b.backpressure_rows == 2 and b.late_rows == 3 and b.rows == 5


def test_non_separating_policies_never_use_the_late_lane():
    b = Batcher(GreedyPolicy(8), CostModel(prior=COST), expiry_action="route_late")
    b.add(hopeless(item="x"), 0.0)
    assert b.late_rows == 0 and b.pop_routed_late() == []
    assert [r.item for r in b.next_batch(0.0).requests] == ["x"]


def test_drain_flushes_everything_as_batches_in_time_work_first():
    b = Batcher(StaticPolicy(max_batch_rows=4, max_queue_delay=60.0), CostModel(prior=COST))
    for i in range(6):
        b.add(req(rows=2, item=i), 0.0)
    assert [r.item for r in b.next_batch(0.0).requests] == [0, 1]  # full
    out = b.drain(0.0)  # no linger wait: everything, within max rows, unsplit
    assert [[r.item for r in x.requests] for x in out] == [[2, 3], [4, 5]]
    assert all(x.reason == REASON_DRAIN for x in out) and len(b) == 0
    a = adaptive(expiry_action="score_late")
    a.add(hopeless(item="late"), 0.0)
    a.add(req(item="ok"), 0.0)
    batches = a.drain(0.0)
    assert [[r.item for r in x.requests] for x in batches] == [["ok"], ["late"]]
    assert [x.late for x in batches] == [False, True]


def test_next_wakeup_is_cleared_by_an_arrival_and_none_when_idle():
    b = Batcher(StaticPolicy(max_batch_rows=8, max_queue_delay=0.005), CostModel(prior=COST))
    assert b.next_batch(0.0) is None and b.next_wakeup() is None
    b.add(req(), 0.0)
    assert b.next_batch(0.001) is None and b.next_wakeup() == pytest.approx(0.005)
    b.add(req(), 0.002)
    assert b.next_wakeup() is None  # ask again: the arrival may change the answer


def test_batcher_validates_its_settings():
    with pytest.raises(ValueError, match="expiry_action"):
        Batcher(GreedyPolicy(8), expiry_action="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="late_share"):
        Batcher(GreedyPolicy(8), late_share=1.5)
    with pytest.raises(ValueError, match="allowed_batch_sizes"):
        Batcher(GreedyPolicy(8), allowed_batch_sizes=[0, 8])


def test_equal_own_deadlines_keep_arrival_order_whatever_the_tail_taken_off_them():
    """The worker takes the answer tail off each deadline as admitted, and the tail
    changes: a later request of the same Kafka timestamp can get the earlier
    tightened deadline. EDF orders by the request's own (Request.due), or one camera's
    frames were published 0, 1, 4, 5, 2, 3 (tests/integration/test_camera_pipeline.py)."""
    b = Batcher(AdaptivePolicy(max_batch_rows=1), CostModel(prior=COST), rate_half_life=1e3)
    for i, tail in enumerate((0.01, 0.05, 0.02)):
        b.add(Request(rows=1, arrival=0.0, deadline=10.0 - tail, due=10.0, item=i), 0.0)
    assert [b.next_batch(0.0).requests[0].item for _ in range(3)] == [0, 1, 2]
