"""The arithmetic behind /api/stats, the dashboard and `tidebatch status`
(pipeline/ops/stats.py, window.py), the health rules (health.py) and the extra
worker metrics (pipeline/observe/metrics.py). No I/O, fake clocks."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest

from pipeline.observe.metrics import WorkerMetrics
from pipeline.ops import health
from pipeline.ops import stats as S
from pipeline.ops import status_report as status
from pipeline.ops.window import StatsWindow

INF = math.inf


# ----------------------------------------------------------------------------- quantiles
@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, [(0.1, 50), (0.2, 100), (INF, 100)], 0.1),
        (0.75, [(0.1, 50), (0.2, 100), (INF, 100)], 0.15),  # halfway through (0.1, 0.2]
        (0.25, [(0.1, 50), (0.2, 100), (INF, 100)], 0.05),  # the first bucket starts at 0
        (0.99, [(0.1, 10), (0.2, 10), (INF, 100)], 0.2),  # in +Inf: the highest finite bound
        (0.5, [(0.1, 0), (INF, 0)], None),  # no observations
        (0.5, [], None),
    ],
)
def test_histogram_quantile_matches_promql(q, buckets, expected):
    got = S.histogram_quantile(q, buckets)
    assert got == pytest.approx(expected) if expected is not None else got is None


def _metrics(pipeline: str = "ctr") -> WorkerMetrics:
    m = WorkerMetrics(pipeline, "adaptive")
    m.slo.labels(pipeline).set(0.1)
    return m


def test_window_stats_use_only_what_happened_between_snapshots():
    m = _metrics()
    for _ in range(100):  # an old backlog: 1 s latencies
        m.e2e.labels("ctr").observe(1.0)
    m.outcome("t", "ok", 100)
    old = S.from_registry(m.registry)
    for _ in range(50):  # the recent window: fast
        m.e2e.labels("ctr").observe(0.004)
    m.outcome("t", "ok", 45)
    m.outcome("t", "dlq", 5)
    m.batch_rows.labels("ctr", "adaptive").observe(30)
    m.batch_rows.labels("ctr", "adaptive").observe(10)
    m.queue_rows.labels("ctr").set(7)
    m.lag.labels("t", "0").set(3)
    m.lag.labels("t", "1").set(4)
    m.assigned.labels("ctr").set(2)
    st = S.window_stats(old, S.from_registry(m.registry), 5.0)["ctr"]
    assert st.throughput_rps == pytest.approx(10.0)  # 50 outcomes in 5 s
    assert st.dlq_per_s == pytest.approx(1.0)
    assert st.p99_ms is not None and st.p99_ms <= 5.0  # the 1 s backlog is not in the window
    assert st.p50_ms is not None and 2.5 <= st.p50_ms <= 5.0
    assert st.batch_rows == pytest.approx(20.0)
    assert st.rows_per_s == pytest.approx(8.0)
    assert st.queue_rows == 7 and st.lag == 7 and st.assigned == 2 and st.slo_ms == pytest.approx(100.0)


def test_window_stats_without_history_have_no_rates():
    st = S.window_stats(None, S.from_registry(_metrics().registry), 0.0)["ctr"]
    assert st.throughput_rps is None and st.p99_ms is None and st.batch_rows is None
    assert st.lag == 0.0  # the per-pipeline lag always exists, summed over no partition


def test_a_counter_that_went_down_was_reset():
    m = _metrics()
    m.outcome("t", "ok", 500)
    old = S.from_registry(m.registry)
    fresh = _metrics()  # the worker restarted: counters from zero
    fresh.outcome("t", "ok", 20)
    st = S.window_stats(old, S.from_registry(fresh.registry), 2.0)["ctr"]
    assert st.throughput_rps == pytest.approx(10.0)


def test_merge_sums_workers_but_not_the_slo():
    a, b = _metrics(), _metrics()
    a.outcome("t", "ok", 10)
    b.outcome("t", "ok", 30)
    a.lag.labels("t", "0").set(5)
    b.lag.labels("t", "1").set(6)
    merged = S.merge([S.from_registry(a.registry), S.from_registry(b.registry)])
    st = S.window_stats(None, merged, 0.0)["ctr"]
    assert st.lag == 11 and st.slo_ms == pytest.approx(100.0)
    assert sum(merged["tidebatch_records_total"].values()) == 40


def test_from_text_reads_the_exposition_format():
    from prometheus_client import generate_latest

    m = _metrics()
    m.outcome("t", "late", 3)
    assert S.from_text(generate_latest(m.registry).decode()) == S.from_registry(m.registry)


# ----------------------------------------------------------------------------- verdicts
def _stats(**kw) -> S.PipelineStats:
    base = dict(throughput_rps=100.0, rows_per_s=2000.0, dlq_per_s=0.0, p50_ms=10.0, p99_ms=50.0,
                slo_ms=100.0, batch_rows=20.0, queue_rows=0.0, lag=0.0, assigned=4.0, ready=2.0)
    return S.PipelineStats(**{**base, **kw})


@pytest.mark.parametrize(
    ("stats", "growing", "up", "verdict"),
    [
        (_stats(), False, 2, S.OK),
        (_stats(p99_ms=150.0), False, 2, S.DEGRADED),
        (_stats(lag=5000.0), True, 2, S.DEGRADED),
        (_stats(), False, 0, S.DOWN),
        (_stats(ready=0.0), False, 2, S.DOWN),
        (_stats(assigned=0.0), False, 1, S.DOWN),
        (_stats(p99_ms=None), False, 1, S.OK),  # idle: no latency in the window is fine
    ],
)
def test_verdict(stats, growing, up, verdict):
    got, reasons = S.verdict(stats, growing, up)
    assert got == verdict
    assert bool(reasons) == (verdict != S.OK)


@pytest.mark.parametrize(
    ("old", "new", "rps", "growing"),
    [
        (100.0, 5000.0, 100.0, True),
        (5000.0, 4000.0, 100.0, False),  # large but shrinking
        (10.0, 60.0, 10.0, False),  # rising but tiny: noise
        (1000.0, 1200.0, 2000.0, False),  # under a second of throughput in flight
        (None, 5000.0, 100.0, False),
    ],
)
def test_lag_growing(old, new, rps, growing):
    assert S.lag_growing(old, _stats(lag=new, throughput_rps=rps)) is growing


# ----------------------------------------------------------------------------- window
def test_stats_window_keeps_a_bounded_history_smoothed_over_smooth_s():
    m = _metrics()
    now = [0.0]
    w = StatsWindow(lambda: S.from_registry(m.registry), interval_s=1.0, window_s=10.0, smooth_s=3.0,
                    clock=lambda: now[0], wall=lambda: 1000.0 + now[0])
    for _ in range(15):
        m.outcome("t", "ok", 6)  # 6 per second, every second
        w.sample()
        now[0] += 1.0
    doc = w.as_json()
    ctr = doc["pipelines"]["ctr"]
    assert len(ctr["t"]) == 10  # window_s / interval_s points
    assert ctr["t"][-1] == 1014.0
    assert ctr["throughput_rps"][-1] == pytest.approx(6.0)  # over the last 3 s
    assert all(len(ctr[k]) == 10 for k in ("p99_ms", "lag", "batch_rows", "queue_rows"))
    assert doc["latest"]["ctr"]["slo_ms"] == 100.0 and ctr["slo_ms"] == 100.0


def test_stats_window_rejects_nonsense_settings():
    with pytest.raises(ValueError):
        StatsWindow(dict, interval_s=5.0, smooth_s=1.0)


# ----------------------------------------------------------------------------- health
def _worker(**kw) -> SimpleNamespace:
    started = threading.Event()
    if kw.pop("started", True):
        started.set()
    base = dict(started=started, assigned=[("t", 0)], last_poll_ok=100.0,
                session=SimpleNamespace(provider="cpu"), threads=lambda: [], stopping=False, failure=None)
    return SimpleNamespace(**{**base, **kw})


def test_ready_only_with_partitions_model_and_a_recent_poll():
    assert health.readiness(_worker(), now=101.0)[0] is True
    for worker, now, reason in [
        (_worker(started=False, last_poll_ok=None), 101.0, "not started"),
        (_worker(assigned=[]), 101.0, "no partitions assigned"),
        (_worker(), 110.0, "no successful broker poll for 10.0 s"),
        (_worker(session=SimpleNamespace(provider=None)), 101.0, "model not loaded"),
    ]:
        ok, body = health.readiness(worker, now)
        assert not ok and reason in body["reason"], body


def test_alive_while_loading_and_rebalancing_dead_when_stuck():
    assert health.liveness(_worker(started=False, last_poll_ok=None), now=1e6)[0] is True
    assert health.liveness(_worker(assigned=[]), now=101.0)[0] is True  # no partitions: still alive
    ok, body = health.liveness(_worker(), now=100.0 + health.STALL_S + 1)
    assert not ok and "stalled" in body["reason"]
    dead = threading.Thread(target=lambda: None, name="executor-0")
    dead.start()
    dead.join()
    ok, body = health.liveness(_worker(threads=lambda: [dead]), now=101.0)
    assert not ok and "executor-0" in body["reason"]
    ok, body = health.liveness(_worker(), now=101.0, source_thread=dead)
    assert not ok and "exited" in body["reason"]


def test_a_failed_worker_is_neither_alive_nor_ready_also_while_it_stops():
    """A dead publisher thread used to leave /healthz and /readyz at 200 while no
    request got an outcome any more (issue: no message may wedge a worker)."""
    dead = threading.Thread(target=lambda: None, name="publisher")
    dead.start()
    dead.join()
    worker = _worker(failure="publisher thread died: MemoryError: ", threads=lambda: [dead], stopping=True)
    ok, body = health.liveness(worker, now=101.0)
    assert not ok and body["reason"].startswith("worker failed: publisher thread died")
    ok, body = health.readiness(worker, now=101.0)
    assert not ok and body["reason"].startswith("worker failed")
    ok, body = health.liveness(_worker(threads=lambda: [dead]), now=101.0)
    assert not ok and "publisher" in body["reason"]


# ----------------------------------------------------------------------------- metrics
def test_commit_counter_stamps_the_last_commit_time():
    m = _metrics()
    stamp = m.registry.get_sample_value("tidebatch_last_commit_timestamp_seconds", {"pipeline": "ctr"})
    assert stamp is not None and stamp > 0  # start time until the first commit
    m.commits.labels("ctr", "error").inc()
    assert m.registry.get_sample_value("tidebatch_last_commit_timestamp_seconds", {"pipeline": "ctr"}) == stamp
    m.commits.labels(pipeline="ctr", result="ok").inc()
    assert m.registry.get_sample_value("tidebatch_commits_total", {"pipeline": "ctr", "result": "ok"}) == 1
    assert m.registry.get_sample_value("tidebatch_last_commit_timestamp_seconds", {"pipeline": "ctr"}) >= stamp


def test_pipeline_lag_is_the_sum_of_partition_lags():
    m = _metrics()
    m.lag.labels("t", "0").set(10)
    m.lag.labels("t", "3").set(5)
    assert m.registry.get_sample_value("tidebatch_pipeline_lag_messages", {"pipeline": "ctr"}) == 15
    m.lag.remove("t", "0")
    assert m.registry.get_sample_value("tidebatch_pipeline_lag_messages", {"pipeline": "ctr"}) == 5


# ----------------------------------------------------------------------------- status
@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("http://w:9400", "http://w:9400/metrics"),
        ("http://w:9400/", "http://w:9400/metrics"),
        ("w:9400", "http://w:9400/metrics"),
        ("http://w:9400/metrics", "http://w:9400/metrics"),
    ],
)
def test_metrics_url(given, url):
    assert status.metrics_url(given) == url


def test_status_report_aggregates_workers_per_pipeline():
    snaps = {}
    for name, n in (("a", 40), ("b", 60)):
        m = _metrics()
        old = S.from_registry(m.registry)
        m.outcome("t", "ok", n)
        m.assigned.labels("ctr").set(3)
        m.ready.labels("ctr").set(1)
        snaps[name] = (old, S.from_registry(m.registry))
    report = status.report_from_snapshots(snaps, 2.0, {"c": "connection refused"})
    (ctr,) = report.pipelines
    assert ctr.workers_up == 2 and ctr.verdict == S.OK
    assert ctr.stats.throughput_rps == pytest.approx(50.0) and ctr.stats.assigned == 6
    assert not report.ok  # a worker is down
    text = status.format_report(report)
    assert text.splitlines()[0].split() == ["PIPELINE", "WORKERS", "THROUGHPUT", "P99", "/", "SLO", "BATCH", "LAG", "VERDICT"]
    assert "50.0 req/s" in text and "down: c: connection refused" in text


def test_status_with_no_worker_answering_is_down():
    report = status.report_from_snapshots({}, 2.0, {"http://x/metrics": "refused"})
    assert [p.verdict for p in report.pipelines] == [S.DOWN] and not report.ok


def test_status_from_prometheus_values():
    rep = status._prom_pipeline("ctr", {
        "throughput_rps": 100.0, "rows_per_s": 2000.0, "batches_per_s": 50.0, "p50": 0.01, "p99": 0.2,
        "slo": 0.1, "lag": 9000.0, "lag_before": 1000.0, "assigned": 6.0, "ready": 3.0, "workers": 3.0,
    }, lag_min=100.0)
    assert rep.verdict == S.DEGRADED and rep.workers_up == 3
    assert rep.stats.batch_rows == pytest.approx(40.0) and rep.stats.p99_ms == pytest.approx(200.0)
    assert any("p99" in r for r in rep.reasons) and any("lag growing" in r for r in rep.reasons)


def test_histogram_observe_many_counts_like_observe_one_by_one() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from pipeline.observe.metrics import observe_many

    buckets = (0.001, 0.01, 0.1, 1.0)
    one, many = (Histogram("h", "h", registry=CollectorRegistry(), buckets=buckets) for _ in range(2))
    values = [0.0, 0.001, 0.0011, 0.01, 0.5, 1.0, 7.0, 0.05, 0.05]  # on and between bounds
    for v in values:
        one.observe(v)
    observe_many(many, values)
    observe_many(many, [])

    def samples(h: Histogram) -> dict:
        return {(s.name, s.labels.get("le")): s.value for s in h.collect()[0].samples if s.name != "h_created"}

    assert samples(many) == pytest.approx(samples(one))  # the sum's rounding may differ


def test_stage_breakdown_gives_each_stage_its_quantiles_and_mean() -> None:
    from pipeline.observe.metrics import WorkerMetrics
    from pipeline.ops.stats import from_registry, stage_breakdown

    m = WorkerMetrics("ctr", "adaptive")
    for _ in range(99):
        m.stage.labels("ctr", "queue").observe(0.004)
    m.stage.labels("ctr", "queue").observe(0.9)
    m.stage.labels("ctr", "model").observe(0.002)
    before = from_registry(m.registry)
    m.stage.labels("ctr", "model").observe(0.002)
    got = stage_breakdown(None, from_registry(m.registry), "ctr")
    assert list(got) == ["to_worker", "decode", "queue", "model", "publish"]  # no to_broker: none observed
    assert got["queue"]["requests"] == 100 and got["queue"]["mean_ms"] == round((99 * 4 + 900) / 100, 2)
    assert 2.5 < got["queue"]["p50_ms"] <= 5.0 and got["queue"]["p99_ms"] <= 5.0  # bucket-interpolated
    assert got["to_worker"] == {"requests": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None}
    # Between two snapshots: only what happened in between.
    assert stage_breakdown(before, from_registry(m.registry), "ctr")["model"]["requests"] == 1


def test_the_produce_leg_is_listed_first_once_observed() -> None:
    """to_broker (LogAppendTime topics with the producer's header only) comes before
    to_worker in pipeline order, and only where it covers a request."""
    from pipeline.observe.metrics import WorkerMetrics
    from pipeline.ops.stats import from_registry, stage_breakdown

    m = WorkerMetrics("ctr", "adaptive")
    m.stage.labels("ctr", "to_broker").observe(0.004)
    before = from_registry(m.registry)
    got = stage_breakdown(None, before, "ctr")
    assert list(got) == ["to_broker", "to_worker", "decode", "queue", "model", "publish"]
    assert got["to_broker"]["requests"] == 1 and got["to_broker"]["mean_ms"] == 4.0
    assert "to_broker" not in stage_breakdown(before, from_registry(m.registry), "ctr")  # none in between


def test_a_redis_that_rejects_the_worker_makes_it_unready_an_outage_does_not():
    """docs/REDIS.md: a Redis outage is served through with default features (ready);
    a rejected password or certificate will not pass by itself (not ready)."""
    link = SimpleNamespace(up=False, problem=None)
    ok, body = health.readiness(_worker(redis=SimpleNamespace(link=link)), now=101.0)
    assert ok and body["checks"]["redis"] == {"up": False, "problem": None}
    link.problem = "redis: authentication failed for user 'tb' at rediss://h:1/0 (wrong password ...): x"
    ok, body = health.readiness(_worker(redis=SimpleNamespace(link=link)), now=101.0)
    assert not ok and body["reason"] == link.problem
    assert "redis" not in health.readiness(_worker(redis=None), now=101.0)[1]["checks"]


# ----------------------------------------------------------------------------- tenants
def _tenant_worker() -> tuple[WorkerMetrics, object, object]:
    from pipeline.batching.request import Request
    from pipeline.batching.tenants import TenantClass, TenantGate
    from pipeline.observe.tenant_metrics import watch_tenants

    m = _metrics()
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
    m = _metrics()
    w = StatsWindow(lambda: S.from_registry(m.registry), interval_s=1.0, window_s=10.0, smooth_s=2.0)
    m.outcome("t", "ok", 1)
    w.sample()
    doc = w.as_json()
    assert doc["pipelines"]["ctr"]["tenants"] == {} and doc["latest"]["ctr"]["tenants"] == []


def test_status_without_tenant_classes_has_no_tenant_lines():
    m = _metrics()
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
