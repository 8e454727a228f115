"""Dispatch rules of each batching policy, driven through the pure Batcher on a fake
clock (no sleeps, no threads)."""

from __future__ import annotations

import pytest

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.policies import AdaptivePolicy, GreedyPolicy, NonePolicy, StaticPolicy
from pipeline.batching.policy_base import PolicyContext
from pipeline.batching.queue import RequestQueue
from pipeline.batching.registry import make_policy
from pipeline.batching.request import (
    REASON_DEADLINE,
    REASON_FULL,
    REASON_IDLE,
    REASON_LINGER,
    REASON_SINGLE,
    Request,
)
from pipeline.clock import FakeClock

# t(n) = 1 ms + 0.01 ms/row: batching pays (GPU-like).
GPU = AffineCost(a=1e-3, b=1e-5)


def req(rows: int = 1, at: float = 0.0, deadline: float = 10.0, prio: int = 0, bucket=0, item=None) -> Request:
    return Request(rows=rows, arrival=at, deadline=deadline, priority=prio, bucket=bucket, item=item)


def make(policy, cost: AffineCost = GPU, **kw) -> Batcher:
    return Batcher(policy, CostModel(prior=cost), **kw)


def items(batch) -> list:
    return [r.item for r in batch.requests]


# ---------------------------------------------------------------------------- none
def test_none_sends_every_request_alone_in_fifo_order():
    b = make(NonePolicy())
    for i in range(3):
        b.add(req(rows=5, item=i), 0.0)
    batches = [b.next_batch(0.0) for _ in range(3)]
    assert [items(x) for x in batches] == [[0], [1], [2]]
    assert all(x.reason == REASON_SINGLE and x.rows == 5 for x in batches)
    assert b.next_batch(0.0) is None


def test_none_serves_lower_priority_number_first():
    b = make(NonePolicy())
    b.add(req(item="low", prio=2), 0.0)
    b.add(req(item="high", prio=0), 0.0)
    assert items(b.next_batch(0.0)) == ["high"]


# ---------------------------------------------------------------------------- static
def test_static_waits_then_dispatches_at_max_rows_counting_rows_not_messages():
    clock = FakeClock()
    b = make(StaticPolicy(max_batch_rows=64, max_queue_delay=0.010))
    b.add(req(rows=30, item=0), clock.now())
    b.add(req(rows=30, item=1), clock.now())
    assert b.next_batch(clock.now()) is None  # 60 rows < 64, linger not over
    b.add(req(rows=30, item=2), clock.now())  # 90 rows queued
    batch = b.next_batch(clock.now())
    # Full: takes what fits in 64 rows without splitting a request.
    assert batch.reason == REASON_FULL and items(batch) == [0, 1] and batch.rows == 60


def test_static_linger_counts_from_the_oldest_arrival_not_from_the_wait():
    clock = FakeClock()
    b = make(StaticPolicy(max_batch_rows=64, max_queue_delay=0.010))
    b.add(req(rows=1, at=0.0, item="old"), 0.0)
    clock.set(0.008)  # the executor was busy until now
    b.add(req(rows=1, at=0.008, item="new"), clock.now())
    assert b.next_batch(clock.now()) is None
    # The trap would be now + delay = 0.018.
    assert b.next_wakeup() == pytest.approx(0.010)
    clock.set(0.010)
    batch = b.next_batch(clock.now())
    assert batch.reason == REASON_LINGER and items(batch) == ["old", "new"]


def test_static_next_wakeup_is_the_oldest_arrival_plus_delay_across_buckets_and_priorities():
    b = make(StaticPolicy(max_batch_rows=64, max_queue_delay=0.005))
    b.add(req(at=0.003, bucket="a", prio=0), 0.003)
    b.add(req(at=0.001, bucket="a", prio=1), 0.003)  # older, lower priority
    b.add(req(at=0.002, bucket="b"), 0.003)
    assert b.next_batch(0.004) is None
    assert b.next_wakeup() == pytest.approx(0.006)


def test_static_oversize_request_runs_alone():
    b = make(StaticPolicy(max_batch_rows=64, max_queue_delay=0.010))
    b.add(req(rows=100, item="big"), 0.0)
    b.add(req(rows=1, item="small"), 0.0)
    batch = b.next_batch(0.0)
    assert batch.reason == REASON_FULL and items(batch) == ["big"] and batch.rows == 100


def test_static_with_zero_delay_dispatches_at_once():
    b = make(StaticPolicy(max_batch_rows=64, max_queue_delay=0.0))
    b.add(req(item=0), 0.0)
    assert items(b.next_batch(0.0)) == [0]


# ---------------------------------------------------------------------------- greedy
def test_greedy_takes_whatever_is_queued_up_to_max_rows_at_once():
    b = make(GreedyPolicy(max_batch_rows=10))
    b.add(req(rows=3, item=0), 0.0)
    batch = b.next_batch(0.0)
    assert batch.reason == REASON_IDLE and items(batch) == [0]
    for i in range(5):
        b.add(req(rows=3, item=i), 0.0)  # 15 rows
    batch = b.next_batch(0.0)
    assert batch.reason == REASON_FULL and items(batch) == [0, 1, 2] and batch.rows == 9
    assert items(b.next_batch(0.0)) == [3, 4]
    assert b.next_batch(0.0) is None and b.next_wakeup() is None


def test_greedy_priorities_first_then_fifo():
    b = make(GreedyPolicy(max_batch_rows=2))
    b.add(req(item="l1", prio=1), 0.0)
    b.add(req(item="h1", prio=0), 0.0)
    b.add(req(item="l2", prio=1), 0.0)
    b.add(req(item="h2", prio=0), 0.0)
    assert items(b.next_batch(0.0)) == ["h1", "h2"]
    assert items(b.next_batch(0.0)) == ["l1", "l2"]


# ---------------------------------------------------------------------------- adaptive
def test_adaptive_is_work_conserving():
    b = make(AdaptivePolicy(max_batch_rows=512))
    assert AdaptivePolicy().hold_for_efficiency is False
    b.add(req(rows=1, deadline=1.0, item=0), 0.0)
    batch = b.next_batch(0.0)
    assert batch is not None and items(batch) == [0] and batch.reason == REASON_IDLE


def test_adaptive_is_edf_within_a_priority_and_strict_between_priorities():
    b = make(AdaptivePolicy(max_batch_rows=3))
    b.add(req(deadline=0.9, item="late-deadline"), 0.0)
    b.add(req(deadline=0.3, item="tight"), 0.0)
    b.add(req(deadline=0.5, item="mid"), 0.0)
    b.add(req(deadline=5.0, prio=0, item="high-prio"), 0.0)
    b.add(req(deadline=0.2, prio=1, item="low-prio-tightest"), 0.0)
    assert items(b.next_batch(0.0)) == ["tight", "mid", "late-deadline"]
    assert items(b.next_batch(0.0)) == ["high-prio", "low-prio-tightest"]


def test_adaptive_caps_the_batch_so_its_service_time_meets_the_tightest_deadline():
    # t(n) = 1 ms + 1 ms/row, safety 20 %: a deadline 20 ms away allows n with
    # 1.2 * (1 + n) ms <= 20 ms, i.e. 15 rows.
    # A long rate half-life: the load reads light, so early drop stays out of the way.
    b = make(AdaptivePolicy(max_batch_rows=512), cost=AffineCost(a=1e-3, b=1e-3), rate_half_life=1e3)
    b.add(req(rows=1, deadline=0.020, item="tight"), 0.0)
    for i in range(40):
        b.add(req(rows=1, deadline=5.0, item=i), 0.0)
    batch = b.next_batch(0.0)
    assert batch.reason == REASON_DEADLINE
    assert batch.rows == 15 and batch.requests[0].item == "tight"


def test_adaptive_moves_a_request_that_cannot_make_it_even_alone_to_the_late_lane():
    b = make(AdaptivePolicy(max_batch_rows=512), cost=AffineCost(a=1e-3, b=1e-3))
    b.add(req(rows=5, deadline=0.004, item="hopeless"), 0.0)  # needs 6 ms
    b.add(req(rows=1, deadline=1.0, item="fine"), 0.0)
    assert b.late_rows == 5
    first = b.next_batch(0.0)
    assert items(first) == ["fine"] and not first.late
    late = b.next_batch(0.0)
    assert items(late) == ["hopeless"] and late.late and late.reason == "late"
    assert late.requests[0].late


def test_adaptive_sweeps_requests_that_expire_while_queued():
    b = make(AdaptivePolicy(max_batch_rows=1), cost=AffineCost(a=1e-3, b=1e-3))
    b.add(req(rows=1, deadline=0.010, item="a"), 0.0)
    b.add(req(rows=1, deadline=0.011, item="b"), 0.0)
    assert items(b.next_batch(0.0)) == ["a"]
    # 'b' needs 2 ms: at t=9.5 ms it can no longer make 11 ms.
    batch = b.next_batch(0.0095)
    assert batch.late and items(batch) == ["b"]


def _overload(b: Batcher, until: float, rows_per_s: float, rows: int = 20) -> float:
    """Feed a steady stream (with far deadlines) and drain it; returns the end time."""
    t, dt = 0.0, rows / rows_per_s
    while t < until:
        b.add(req(rows=rows, at=t, deadline=t + 100.0), t)
        t += dt
    while b.next_batch(t) is not None:
        pass
    return t


def test_adaptive_early_drop_under_overload_but_not_at_low_load():
    # Capacity 512 / (1 + 5.12) ms ~ 84k rows/s; t(512) * 1.2 ~ 7.3 ms.
    def slack_request_goes_late(rate: float) -> bool:
        b = make(AdaptivePolicy(max_batch_rows=512), cost=GPU)
        now = _overload(b, 1.0, rate)
        # 3 ms of slack: enough alone (1.2 ms), not for a full batch.
        b.add(req(rows=20, at=now, deadline=now + 0.003, item="x"), now)
        for i in range(40):
            b.add(req(rows=20, at=now, deadline=now + 1.0, item=i), now)
        first = b.next_batch(now)  # the sweep decides, with the queue behind it
        return "x" not in items(first) and b.late_rows == 20

    assert slack_request_goes_late(rate=200_000.0)  # 2.4x capacity
    assert not slack_request_goes_late(rate=2_000.0)


def test_adaptive_early_drop_when_a_full_batch_has_waited_whatever_the_rate_says():
    """The rate is measured against the model's curve; in the real pipeline per-batch
    work outside the model holds throughput below it, and a queue that has held a
    full batch for longer than one takes is the evidence of falling behind: a request
    that needs a small batch to make it goes late instead of capping everyone's batch
    at its deadline (bench/burst.py, 120 % of the live capacity)."""
    def goes_late(waited: float) -> bool:
        b = make(AdaptivePolicy(max_batch_rows=512), cost=GPU)
        now = _overload(b, 1.0, 2_000.0)  # the rate says: far below capacity
        at = now - waited
        b.add(req(rows=20, at=at, deadline=now + 0.003, item="x"), now)  # fits alone, not in a full batch
        for i in range(40):  # 800 rows: more than a full batch
            b.add(req(rows=20, at=at, deadline=now + 1.0, item=i), now)
        first = b.next_batch(now)
        return "x" not in items(first) and b.late_rows == 20

    assert goes_late(waited=0.020)  # they waited 20 ms, a full batch takes ~7.3
    assert not goes_late(waited=0.0)  # a burst that has just arrived: x rides a small batch


def test_adaptive_early_drop_uses_the_load_of_its_own_level_and_above():
    b = make(AdaptivePolicy(max_batch_rows=512), cost=GPU)
    t = 0.0
    while t < 1.0:  # heavy low-priority load, light high-priority load
        b.add(req(rows=20, at=t, deadline=t + 100.0, prio=1), t)
        b.add(req(rows=1, at=t, deadline=t + 100.0, prio=0), t)
        t += 20 / 200_000.0
    while b.next_batch(t) is not None:
        pass
    b.add(req(rows=20, at=t, deadline=t + 0.003, prio=0, item="high"), t)
    b.add(req(rows=20, at=t, deadline=t + 0.003, prio=1, item="low"), t)
    for _ in range(40):
        b.add(req(rows=20, at=t, deadline=t + 1.0, prio=1), t)
    late = b.next_batch(t)  # in-time first...
    assert "high" in items(late) and not late.late
    assert b.late_rows == 20  # ...the low-priority one with the same slack went late


def test_adaptive_serves_one_request_at_a_time_when_batching_does_not_pay():
    # t(n) = 37.5 ms/row (a convolutional model on CPU): a bigger batch buys nothing.
    b = make(AdaptivePolicy(max_batch_rows=16), cost=AffineCost(a=0.0, b=37.5e-3))
    b.add(req(rows=1, deadline=10.0, item=0), 0.0)
    b.add(req(rows=1, deadline=10.0, item=1), 0.0)
    assert items(b.next_batch(0.0)) == [0]
    # Where batching pays, the same queue goes out whole.
    g = make(AdaptivePolicy(max_batch_rows=16), cost=GPU)
    g.add(req(rows=1, deadline=10.0, item=0), 0.0)
    g.add(req(rows=1, deadline=10.0, item=1), 0.0)
    assert items(g.next_batch(0.0)) == [0, 1]


def test_adaptive_hold_for_efficiency_spends_slack_never_more():
    policy = AdaptivePolicy(max_batch_rows=512, hold_for_efficiency=True)
    b = make(policy, cost=AffineCost(a=5e-3, b=1e-5))
    t = _overload(b, 1.0, 5_000.0)  # establish the arrival rate, then drain
    b.add(req(rows=20, at=t, deadline=t + 0.100, item="x"), t)
    assert b.next_batch(t) is None  # holds the idle executor...
    wake = b.next_wakeup()
    assert t < wake <= t + 0.100 - 1.2 * 5e-3  # ...but never past its slack
    assert items(b.next_batch(wake)) == ["x"]  # and does not re-arm at its wake-up


def test_adaptive_hold_is_off_when_batching_does_not_pay():
    b = make(AdaptivePolicy(hold_for_efficiency=True), cost=AffineCost(a=0.0, b=1e-3))
    _overload(b, 1.0, 500.0)
    b.add(req(rows=1, deadline=10.0, item="x"), 1.0)
    assert items(b.next_batch(1.0)) == ["x"]


def test_keep_up_rows_matches_the_arrival_rate():
    policy = AdaptivePolicy(max_batch_rows=512)
    cost = CostModel(prior=AffineCost(a=5e-3, b=1e-5))
    n = policy.keep_up_rows(PolicyContext(cost, arrival_rate=20_000.0), 0, headroom=1.0)
    # n / t(n) >= 20k rows/s: n >= 20k * 5 ms / (1 - 20k * 10 us) = 125
    assert n == 125
    assert policy.keep_up_rows(PolicyContext(cost, arrival_rate=1e9), 0) == 512
    assert policy.keep_up_rows(PolicyContext(cost, arrival_rate=0.0), 0) == 1


# ---------------------------------------------------------------------------- rows and buckets
@pytest.mark.parametrize(
    "policy",
    [NonePolicy(), StaticPolicy(64, 0.0), GreedyPolicy(64), AdaptivePolicy(64)],
    ids=lambda p: p.name,
)
def test_requests_of_different_buckets_never_share_a_batch(policy):
    b = make(policy)
    for i in range(6):
        b.add(req(rows=2, bucket=("len", 16 if i % 2 else 32), deadline=10.0, item=i), 0.0)
    seen = []
    while (batch := b.next_batch(0.0)) is not None:
        assert len({r.bucket for r in batch.requests}) == 1
        assert batch.bucket == batch.requests[0].bucket
        seen += items(batch)
    assert sorted(seen) == list(range(6))


@pytest.mark.parametrize("policy", [GreedyPolicy(8), AdaptivePolicy(8)], ids=lambda p: p.name)
def test_a_rare_bucket_is_not_starved(policy):
    b = make(policy)
    t = 0.0
    b.add(req(rows=1, at=t, deadline=t + 1.0, bucket="rare", item="rare"), t)
    served_at = None
    for k in range(20):  # a steady flood of the common bucket, arriving after 'rare'
        t += 0.001
        for _ in range(8):
            b.add(req(rows=1, at=t, deadline=t + 1.0, bucket="common"), t)
        batch = b.next_batch(t)
        if "rare" in items(batch):
            served_at = k
            break
    assert served_at == 0


def test_static_rare_bucket_lingers_on_its_own_timer():
    b = make(StaticPolicy(max_batch_rows=8, max_queue_delay=0.005))
    b.add(req(at=0.0, bucket="rare", item="rare"), 0.0)
    for _ in range(8):
        b.add(req(at=0.001, bucket="common"), 0.001)
    assert b.next_batch(0.001).bucket == "common"  # full
    assert b.next_batch(0.002) is None and b.next_wakeup() == pytest.approx(0.005)
    assert items(b.next_batch(0.005)) == ["rare"]


# ---------------------------------------------------------------------------- allowed sizes
def test_allowed_batch_sizes_pad_up_and_cap_the_batch():
    b = make(GreedyPolicy(64), allowed_batch_sizes=[8, 16, 32])
    for _ in range(5):
        b.add(req(rows=1), 0.0)
    assert b.next_batch(0.0).pad_to_rows == 8
    for _ in range(16):
        b.add(req(rows=1), 0.0)
    assert b.next_batch(0.0).pad_to_rows is None  # exactly an allowed size
    for _ in range(40):
        b.add(req(rows=1), 0.0)
    batch = b.next_batch(0.0)
    assert batch.rows == 32 and batch.pad_to_rows is None  # capped at the largest size
    b.add(req(rows=40, item="big"), 0.0)
    b.next_batch(0.0)  # the 8 left over
    big = b.next_batch(0.0)
    assert items(big) == ["big"] and big.pad_to_rows is None  # oversize: runs as is


def test_static_with_allowed_sizes_is_full_at_the_largest_allowed_size():
    b = make(StaticPolicy(max_batch_rows=64, max_queue_delay=1.0), allowed_batch_sizes=[8, 32])
    for _ in range(32):
        b.add(req(rows=1), 0.0)
    batch = b.next_batch(0.0)
    assert batch is not None and batch.reason == REASON_FULL and batch.rows == 32


def test_observe_feeds_the_padded_size_to_the_cost_model():
    seen = []

    class Spy(CostModel):
        def observe(self, bucket, rows, seconds):
            seen.append(rows)

    b = Batcher(GreedyPolicy(64), Spy(), allowed_batch_sizes=[8, 16])
    b.add(req(rows=3), 0.0)
    batch = b.next_batch(0.0)
    b.observe(batch, 0.002)
    assert seen == [8]


# ---------------------------------------------------------------------------- factory
def test_make_policy_builds_by_name_and_rejects_bad_input():
    assert isinstance(make_policy("static", max_batch_rows=32, max_queue_delay=0.002), StaticPolicy)
    assert make_policy("adaptive").describe()["hold_for_efficiency"] is False
    with pytest.raises(ValueError, match="unknown batching policy 'fast'.*adaptive"):
        make_policy("fast")
    with pytest.raises(ValueError, match="policy 'greedy'"):
        make_policy("greedy", max_queue_delay=1.0)
    with pytest.raises(ValueError):
        make_policy("greedy", max_batch_rows=0)


def test_policies_only_wait_with_a_reason():
    q = RequestQueue("edf")
    ctx = PolicyContext(CostModel(prior=GPU), arrival_rate=0.0)
    for policy in (NonePolicy(), StaticPolicy(), GreedyPolicy(8), AdaptivePolicy()):
        assert policy.decide(q, ctx, 0.0).until is None  # empty: wait for an arrival


def test_congested_cap_stays_small_where_batching_does_not_pay() -> None:
    # CenterFace-like: ~0 call overhead, 17 ms a frame. A queue of frames is congestion,
    # but the cap must stay near the sizes that were measured, not chase 99.8 % of the
    # affine capacity (~60 frames here, which ran slower per frame than one at a time).
    cost = CostModel(prior=AffineCost(a=0.002, b=0.017))
    assert not cost.cost(0).batching_pays()
    policy = AdaptivePolicy(max_batch_rows=512)
    ctx = PolicyContext(cost, arrival_rate=50.0)
    assert policy.batch_cap(ctx, 0, queued_rows=0) == 1
    congested = policy.batch_cap(ctx, 0, queued_rows=100)
    assert 1 < congested <= 6
