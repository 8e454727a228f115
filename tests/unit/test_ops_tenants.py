"""Tenant classes in `tidebatch status` and the dashboard's window (pipeline/ops/stats.py,
window.py, pipeline/commands/status.py): rate, goodput, p99 and throttled rows per
class, share used over two workers, from Prometheus's values too. No I/O."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.observe.metrics import WorkerMetrics
from pipeline.ops import stats as S
from pipeline.ops import status_report as status
from pipeline.ops.window import StatsWindow
from tests.unit.ops_fakes import worker_metrics


def _tenant_worker() -> tuple[WorkerMetrics, object, object]:
    from pipeline.batching.request import Request
    from pipeline.batching.tenants import TenantClass, TenantGate
    from pipeline.observe.tenant_metrics import watch_tenants

    m = worker_metrics()
    m.assigned.labels("ctr").set(1)
    m.ready.labels("ctr").set(1)
    # gold: 100 rows/s, 10 deep; burst: 10 rows/s within a 20 rows/s ceiling, 20 deep.
    gate = TenantGate({"gold": TenantClass("gold", 100.0, 10.0),
                       "burst": TenantClass("burst", 10.0, 10.0, 20.0, 20.0, "shed")})
    outcomes = watch_tenants(m.registry, "ctr", gate, lambda: 0.0, (0.01, 0.1, 1.0), {"gold": 0.05, "burst": 0.5})

    def send(tenant: str, n: int, rows: int = 5) -> None:
        for _ in range(n):
            gate.mark(Request(rows, 0.0, 1.0, tenant=tenant), 0.0)

    return m, (gate, send), outcomes


def test_status_shows_each_tenant_class_rate_goodput_p99_and_throttled_rows():
    m, (gate, send), outcomes = _tenant_worker()
    send("gold", 10)  # before the window: 50 rows, 10 green then 8 yellow
    old = S.from_registry(m.registry)
    send("gold", 2)  # 10 rows, yellow: the bucket is empty at time 0
    send("burst", 6)  # 30 rows: 2 green (10), 2 yellow (10, the ceiling's 20 now spent), 2 red
    gate.shed(SimpleNamespace(rows=10, tenant_class="burst"))
    gate.served([SimpleNamespace(rows=20, tenant_class="gold")], 0.0)  # a batch took 20 of gold's rows
    outcomes.observe([("gold", False, 0.004)] * 3 + [("gold", True, 0.5)])
    outcomes.observe([("burst", False, 0.004)] * 4)
    outcomes.routed(["burst"] * 2)
    report = status.report_from_snapshots({"w": (old, S.from_registry(m.registry))}, 2.0, {})
    (ctr,) = report.pipelines
    t = {x.tenant_class: x for x in ctr.tenants}
    assert set(t) == {"gold", "burst", "default"}
    assert t["gold"].rate_rps == pytest.approx(2.0) and t["gold"].goodput == pytest.approx(0.75)
    # Share used and served: the gauges at the newer snapshot; none for a class without a share.
    assert t["gold"].share_used == pytest.approx(gate.share_used("gold", 0.0)) and t["gold"].share_used > 1.0
    assert t["gold"].share_served == pytest.approx(gate.served_share("gold", 0.0)) and t["gold"].share_served > 0.0
    assert t["burst"].share_served == 0.0 and t["default"].share_used is t["default"].share_served is None
    assert t["gold"].slo_ms == pytest.approx(50.0) and t["gold"].p99_ms > 50.0  # one of four at 0.5 s
    assert (t["gold"].over_share_rows, t["gold"].over_ceiling_rows, t["gold"].shed_rows) == (10, 0, 0)
    assert t["burst"].goodput == pytest.approx(4 / 6) and t["burst"].rate_rps == pytest.approx(3.0)
    assert (t["burst"].over_share_rows, t["burst"].over_ceiling_rows, t["burst"].shed_rows) == (10, 10, 10)
    assert t["burst"].throttled_rows == 20 and not t["burst"].over_sla
    # gold's p99 over its own SLA degrades the pipeline, naming the class.
    assert ctr.verdict == S.DEGRADED and any("tenant class gold" in r for r in ctr.reasons)
    text = status.format_report(report)
    assert "TENANT CLASS" in text and "ctr/burst" in text and "66.67 %" in text
    assert status.json.loads(status.json.dumps(report.as_dict()))["pipelines"][0]["tenants"][0]["tenant_class"] == "burst"


def test_a_tenant_class_share_used_over_two_workers_is_the_higher_not_the_sum():
    """Each worker's gate holds the class's share of capacity_rows_per_s, so the ratio
    is per worker: adding two workers' would show a class at its share on both as twice
    over it."""
    m1, (_, send1), _ = _tenant_worker()
    m2, (g2, send2), _ = _tenant_worker()
    send1("gold", 1)
    send2("gold", 4)
    snaps = {w: (S.from_registry(m.registry), S.from_registry(m.registry)) for w, m in (("w1", m1), ("w2", m2))}
    report = status.report_from_snapshots(snaps, 2.0, {})
    gold = next(x for x in report.pipelines[0].tenants if x.tenant_class == "gold")
    assert gold.share_used == pytest.approx(g2.share_used("gold", 0.0))
    assert "SHARE USED / SERVED" in status.format_report(report)


def test_the_dashboard_window_carries_each_tenant_class_aligned_on_the_pipelines_time():
    """/api/stats feeds the built-in dashboard's tenant panels (pipeline/ops/static/
    dashboard.js): per class the figures `tidebatch status` prints, one point a sample."""
    m, (gate, send), outcomes = _tenant_worker()
    now = [0.0]
    w = StatsWindow(lambda: S.from_registry(m.registry), interval_s=1.0, window_s=10.0, smooth_s=2.0,
                    clock=lambda: now[0], wall=lambda: 1000.0 + now[0])
    for i in range(4):
        send("gold", 2)
        outcomes.observe([("gold", False, 0.004)] * 2)
        if i >= 2:  # burst appears in the third window
            outcomes.observe([("burst", False, 0.004), ("burst", True, 0.3)])
        w.sample()
        now[0] += 1.0
    doc = w.as_json()
    ctr = doc["pipelines"]["ctr"]
    gold, burst = ctr["tenants"]["gold"], ctr["tenants"]["burst"]
    assert all(len(series) == len(ctr["t"]) == 4 for series in (*gold.values(), *burst.values()) if isinstance(series, list))
    assert gold["rate_rps"][-1] == pytest.approx(2.0) and gold["goodput"][-1] == 1.0
    assert gold["slo_ms"] == pytest.approx(50.0) and burst["slo_ms"] == pytest.approx(500.0)
    assert gold["share_used"][-1] == pytest.approx(gate.share_used("gold", 0.0), rel=1e-3)
    assert burst["goodput"][:2] == [None, None] and burst["goodput"][-1] == pytest.approx(0.5)
    latest = {x["tenant_class"]: x for x in doc["latest"]["ctr"]["tenants"]}
    assert latest["burst"]["goodput"] == pytest.approx(0.5) and latest["gold"]["throttled_rows"] >= 0


def test_the_dashboard_window_has_no_tenants_without_a_tenants_section():
    m = worker_metrics()
    w = StatsWindow(lambda: S.from_registry(m.registry), interval_s=1.0, window_s=10.0, smooth_s=2.0)
    m.outcome("t", "ok", 1)
    w.sample()
    doc = w.as_json()
    assert doc["pipelines"]["ctr"]["tenants"] == {} and doc["latest"]["ctr"]["tenants"] == []


def test_status_without_tenant_classes_has_no_tenant_lines():
    m = worker_metrics()
    m.assigned.labels("ctr").set(1)
    old = S.from_registry(m.registry)
    m.outcome("t", "ok", 10)
    report = status.report_from_snapshots({"w": (old, S.from_registry(m.registry))}, 2.0, {})
    assert report.pipelines[0].tenants == [] and "TENANT" not in status.format_report(report)


def test_tenant_status_from_prometheus_values():
    from pipeline.ops.tenant_stats import from_prom_values, tenant_queries

    queries = tenant_queries('job="w"', "1m")
    assert 'outcome="ok"' in queries["ok"] and "tenant_class" in queries["p99"]
    assert "avg_over_time(tidebatch_tenant_share_used" in queries["used"] and "max by" in queries["served"]
    (gold,) = from_prom_values({"gold": {"rate": 5.0, "outcomes": 300.0, "ok": 297.0, "p99": 0.02,
                                         "slo": 0.03, "yellow": 40.0, "red": None, "shed": None,
                                         "used": 1.3, "served": float("nan")}})
    assert gold.share_used == 1.3 and gold.share_served is None
    assert gold.goodput == pytest.approx(0.99) and gold.p99_ms == pytest.approx(20.0) and not gold.over_sla
    assert gold.throttled_rows == 40 and gold.shed_rows == 0
