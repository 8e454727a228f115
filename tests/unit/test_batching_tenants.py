"""Tenant isolation in the batching core (pipeline/batching/tenants.py): the token
buckets, the colours, what the Batcher does with each. Fake time only."""

from __future__ import annotations

import pytest

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.policies import AdaptivePolicy, GreedyPolicy
from pipeline.batching.queue import RequestQueue
from pipeline.batching.request import Request
from pipeline.batching.tenants import (
    GREEN,
    RED,
    TIER_RED,
    TIER_SERVED_GREEN,
    TIER_STEP,
    YELLOW,
    YELLOW_LEVELS,
    TenantClass,
    TenantGate,
    TokenBucket,
    base_priority,
)


def req(tenant: str | None, rows: int = 1, deadline: float = 10.0, prio: int = 0, item=None) -> Request:
    return Request(rows=rows, arrival=0.0, deadline=deadline, priority=prio, item=item, tenant=tenant)


def gate(**classes: TenantClass) -> TenantGate:
    return TenantGate(classes, members={"acme-eu": "gold"} if "gold" in classes else {})


GOLD = TenantClass("gold", rate=10.0, depth=2.0)
CAPPED = TenantClass("capped", rate=10.0, depth=1.0, ceiling=20.0, ceiling_depth=2.0, beyond="shed")


def test_token_bucket_refills_at_its_rate_up_to_its_depth():
    b = TokenBucket(rate=10.0, depth=2.0)
    b.refill(0.0)
    assert b.has(2) and b.has(3)  # over the depth: conforms on a full bucket
    b.take(1)
    assert b.has(1) and not b.has(2)
    b.take(1)
    assert not b.has(1)
    b.refill(0.05)  # half a row
    assert not b.has(1)
    b.refill(0.1)
    assert b.has(1)
    b.refill(100.0)
    assert b.tokens == 2.0


def test_a_request_larger_than_the_depth_conforms_on_a_full_bucket_and_leaves_a_debt():
    b = TokenBucket(rate=10.0, depth=2.0)
    b.refill(0.0)
    assert b.has(5)
    b.take(5)
    b.refill(0.4)  # -3 + 4 = 1
    assert b.tokens == pytest.approx(1.0)


def test_within_the_share_green_over_it_yellow_a_tier_down():
    g = gate(gold=GOLD)
    colours = [g.mark(r, 0.0) for r in (req("gold", prio=1), req("acme-eu", prio=1), req("gold", prio=1))]
    assert colours == [GREEN, GREEN, YELLOW]
    r = req("gold", prio=1)
    g.mark(r, 0.1)  # one row refilled
    assert r.priority == 1 and r.tenant_class == "gold"
    late = req("gold", prio=1)
    assert g.mark(late, 0.1) == YELLOW
    assert late.priority > TIER_STEP and base_priority(late.priority) == 1
    assert g.counters["gold"].rows == {GREEN: 3, YELLOW: 2, RED: 0}


def test_unknown_tenants_fall_in_default_which_is_best_effort_unless_declared():
    g = gate(gold=GOLD)
    assert g.class_of("someone") == "default" and g.class_of(None) == "default"
    assert g.mark(req("someone"), 0.0) == YELLOW
    declared = gate(gold=GOLD, default=TenantClass("default", rate=5.0, depth=1.0))
    assert declared.mark(req("someone"), 0.0) == GREEN


def test_beyond_the_ceiling_red():
    g = gate(capped=CAPPED)
    colours = [g.mark(req("capped"), 0.0) for _ in range(3)]
    assert colours == [GREEN, YELLOW, RED]
    assert g.beyond(req("x", prio=0)) == "queue"  # default class


def test_bad_classes_are_refused():
    with pytest.raises(ValueError, match="ceiling"):
        TenantClass("x", rate=10.0, depth=1.0, ceiling=5.0)
    with pytest.raises(ValueError, match="beyond"):
        TenantClass("x", rate=1.0, depth=1.0, beyond="drop")
    with pytest.raises(ValueError, match="unknown class"):
        TenantGate({"gold": GOLD}, members={"a": "silver"})


def greedy(g: TenantGate, **kw) -> Batcher:
    return Batcher(GreedyPolicy(max_batch_rows=4), CostModel(prior=AffineCost(1e-3, 1e-3)), tenants=g, **kw)


def test_green_requests_of_every_tenant_go_before_a_bursters_excess_and_share_its_batches():
    g = gate(gold=GOLD, burst=TenantClass("burst", rate=10.0, depth=2.0))
    b = greedy(g)
    for i in range(5):  # the burster first: 2 green, 3 yellow
        b.add(req("burst", item=f"b{i}", deadline=1.0), 0.0)
    b.add(req("gold", item="g0", deadline=5.0), 0.0)
    b.add(req("gold", item="g1", deadline=5.0), 0.0)
    first = b.next_batch(0.0)
    # EDF within the green tier (the burster's tighter deadlines first), then yellow.
    assert [r.item for r in first.requests] == ["b0", "b1", "g0", "g1"]
    second = b.next_batch(0.0)
    assert [r.item for r in second.requests] == ["b2", "b3", "b4"]


def test_without_a_gate_the_same_arrivals_are_served_by_deadline_alone():
    b = Batcher(GreedyPolicy(max_batch_rows=4), CostModel(prior=AffineCost(1e-3, 1e-3)))
    for i in range(5):
        b.add(req("burst", item=f"b{i}", deadline=1.0), 0.0)
    b.add(req("gold", item="g0", deadline=5.0), 0.0)
    assert [r.item for r in b.next_batch(0.0).requests] == ["b0", "b1", "b2", "b3"]


def test_red_shed_is_routed_late_and_counted():
    g = gate(capped=CAPPED)
    b = greedy(g)
    for i in range(3):
        b.add(req("capped", item=i), 0.0)
    routed = b.pop_routed_late()
    assert [r.item for r in routed] == [2] and routed[0].late
    assert g.counters["capped"].shed_rows == 1 and len(b) == 2


def test_red_score_late_goes_to_the_late_lane_and_queue_goes_below_every_yellow():
    lane = TenantClass("c", rate=10.0, depth=1.0, ceiling=10.0, ceiling_depth=1.0, beyond="score_late")
    b = greedy(gate(c=lane), expiry_action="route_late")
    b.add(req("c", item="ok"), 0.0)
    b.add(req("c", item="over"), 0.0)
    assert b.late_rows == 1 and b.pop_routed_late() == []
    queued = TenantClass("q", rate=10.0, depth=1.0, ceiling=10.0, ceiling_depth=1.0)
    g = gate(q=queued)
    over = req("q")
    g.mark(req("q"), 0.0)
    assert g.mark(over, 0.0) == RED and over.priority == TIER_RED * TIER_STEP > (YELLOW_LEVELS + 1) * TIER_STEP


def test_adaptive_policy_keeps_green_deadlines_under_a_bursting_tenant():
    """A tenant within its share keeps its deadline when another floods the queue:
    with the gate its request is in the first batch, without it behind the flood."""
    cost = CostModel(prior=AffineCost(1e-3, 1e-4))

    def run(g: TenantGate | None) -> bool:
        b = Batcher(AdaptivePolicy(max_batch_rows=8), cost, tenants=g, rate_half_life=1e3)
        for i in range(64):
            b.add(req("burst", item=f"b{i}", deadline=0.004), 0.0)
        b.add(req("gold", item="gold", deadline=0.005), 0.0)
        batch = b.next_batch(0.0)
        return batch is not None and "gold" in [r.item for r in batch.requests]

    assert run(gate(gold=GOLD, burst=TenantClass("burst", rate=10.0, depth=2.0)))
    assert not run(None)


def test_yellow_tiers_order_the_over_share_by_how_far_over_they_are():
    """A tenant at its share whose bucket ran dry for a moment goes before one sending
    three times its share (both yellow)."""
    g = TenantGate({"calm": TenantClass("calm", 100.0, 1.0), "loud": TenantClass("loud", 100.0, 1.0)})
    t = 0.0
    for _ in range(400):  # two seconds: calm at its rate, loud at three times it
        t += 0.005
        g.mark(req("calm" if int(t * 1000) % 10 == 0 else "loud"), t)
        g.mark(req("loud"), t)
    calm, loud = req("calm"), req("loud")
    g.mark(req("calm"), t)  # empties calm's bucket
    assert g.mark(calm, t) == YELLOW and g.mark(loud, t) == YELLOW
    assert TIER_STEP <= calm.priority < loud.priority


def _steady_and_burster(served_share: float) -> tuple[TenantGate, float]:
    """Two classes of 100 rows/s, each with a one-row bucket, for two seconds: steady at
    its share and served all of it, burst at three times its share and served
    `served_share` of its share; then 50 ms of quiet, so both buckets are full."""
    g = TenantGate({"steady": TenantClass("steady", 100.0, 1.0), "burst": TenantClass("burst", 100.0, 1.0)})
    t = 0.0
    for tick in range(200):  # 10 ms each
        t += 0.01
        steady, burst = req("steady"), req("burst", rows=3)
        g.mark(steady, t)
        g.mark(burst, t)
        g.served([steady], t)
        if tick % 10 == 0:  # a tenth of a second's worth at served_share × 100 rows/s
            burst.rows = round(served_share * 10)
            g.served([burst], t)
    return g, t + 0.05


def test_an_over_share_class_already_served_its_share_yields_within_green():
    """The shares may add up to the whole capacity, so green alone can be critical: a
    burster whose share is already served ranks its green after the other classes'
    green and after their moments over their share (yellow level 1), still before
    anyone's excess further over (docs/BATCHING.md, "Tenants in the simulator")."""
    g, t = _steady_and_burster(served_share=1.2)
    steady_green, burst_green = req("steady"), req("burst")
    assert g.mark(steady_green, t) == GREEN and g.mark(burst_green, t) == GREEN
    steady_yellow, burst_yellow = req("steady"), req("burst")
    assert g.mark(steady_yellow, t) == YELLOW and g.mark(burst_yellow, t) == YELLOW
    assert g.served_share("burst", t) >= 1.0 and g.share_used("burst", t) > 1.25
    assert [r.priority // TIER_STEP for r in (steady_green, steady_yellow, burst_green)] == [0, 1, TIER_SERVED_GREEN]
    assert burst_yellow.priority // TIER_STEP > TIER_SERVED_GREEN

    q = RequestQueue("edf")  # the batcher's queue, as marked
    for r, item in ((burst_green, "burst green"), (steady_yellow, "steady yellow"), (steady_green, "steady green")):
        r.item = item
        q.push(r)
    assert [r.item for r in q.take(0, 2)] == ["steady green", "steady yellow"]


def test_an_over_share_class_served_less_than_its_share_keeps_its_green_first():
    """Its guarantee is not met: its green ranks with everyone's, ahead of any yellow,
    however far over its share it sends."""
    g, t = _steady_and_burster(served_share=0.5)
    burst_green = req("burst")
    assert g.mark(burst_green, t) == GREEN and g.share_used("burst", t) > 1.25
    assert g.served_share("burst", t) < 1.0 and burst_green.priority == 0


def test_the_batcher_counts_rows_served_per_class_but_not_the_late_lanes():
    g = gate(gold=GOLD)
    b = Batcher(AdaptivePolicy(max_batch_rows=4), CostModel(prior=AffineCost(1e-3, 1e-3)), tenants=g,
                expiry_action="score_late")
    b.add(req("gold", rows=2, item="on time"), 0.0)
    b.add(req("gold", rows=1, item="hopeless", deadline=-1.0), 0.0)  # to the late lane
    assert b.late_rows == 1
    assert g.served_share("gold", 0.0) == 0.0
    assert [r.item for r in b.next_batch(0.0).requests] == ["on time"]
    served = g.served_share("gold", 0.0)
    assert served > 0.0
    assert b.next_batch(0.0).late and g.served_share("gold", 0.0) == served


def test_metrics_per_class_never_per_raw_tenant_id():
    from prometheus_client import CollectorRegistry

    from pipeline.observe.tenant_metrics import watch_tenants

    g = gate(capped=CAPPED)
    b = greedy(g)
    for i in range(3):
        b.add(req("capped", item=i), 0.0)
    b.add(req("tenant-no-one-declared"), 0.0)
    registry = CollectorRegistry()
    watch_tenants(registry, "ctr", g, lambda: 0.0)
    watch_tenants(registry, "ctr", None, lambda: 0.0)  # no gate: nothing registered

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"pipeline": "ctr", **labels})

    assert [value("tidebatch_tenant_rows_total", tenant_class="capped", colour=c) for c in (GREEN, YELLOW, RED)] == [1, 1, 1]
    assert value("tidebatch_tenant_shed_rows_total", tenant_class="capped") == 1
    assert value("tidebatch_tenant_rows_total", tenant_class="default", colour=YELLOW) == 1
    assert value("tidebatch_tenant_share_used", tenant_class="capped") > 1  # three rows at once, on a 10 rows/s share
    assert value("tidebatch_tenant_share_served", tenant_class="capped") == 0  # no batch taken yet
    b.next_batch(0.0)
    assert value("tidebatch_tenant_share_served", tenant_class="capped") > 0
    assert value("tidebatch_tenant_share_served", tenant_class="default") is None  # best effort: no share
    assert value("tidebatch_tenant_share_used", tenant_class="default") is None  # no share
    names = {s.labels.get("tenant_class") for m in registry.collect() for s in m.samples}
    assert names == {"capped", "default"}
