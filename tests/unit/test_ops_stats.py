"""The arithmetic behind /api/stats and the dashboard (pipeline/ops/stats.py,
window.py) and the extra worker metrics (pipeline/observe/metrics.py): quantiles as PromQL
has them, window rates, verdicts, the stage breakdown. No I/O, fake clocks."""

from __future__ import annotations

import math

import pytest

from pipeline.ops import stats as S
from pipeline.ops.window import StatsWindow
from tests.unit.ops_fakes import worker_metrics

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


def test_window_stats_use_only_what_happened_between_snapshots():
    m = worker_metrics()
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
    st = S.window_stats(None, S.from_registry(worker_metrics().registry), 0.0)["ctr"]
    assert st.throughput_rps is None and st.p99_ms is None and st.batch_rows is None
    assert st.lag == 0.0  # the per-pipeline lag always exists, summed over no partition


def test_a_counter_that_went_down_was_reset():
    m = worker_metrics()
    m.outcome("t", "ok", 500)
    old = S.from_registry(m.registry)
    fresh = worker_metrics()  # the worker restarted: counters from zero
    fresh.outcome("t", "ok", 20)
    st = S.window_stats(old, S.from_registry(fresh.registry), 2.0)["ctr"]
    assert st.throughput_rps == pytest.approx(10.0)


def test_merge_sums_workers_but_not_the_slo():
    a, b = worker_metrics(), worker_metrics()
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

    m = worker_metrics()
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
    m = worker_metrics()
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


# ----------------------------------------------------------------------------- metrics
def test_commit_counter_stamps_the_last_commit_time():
    m = worker_metrics()
    stamp = m.registry.get_sample_value("tidebatch_last_commit_timestamp_seconds", {"pipeline": "ctr"})
    assert stamp is not None and stamp > 0  # start time until the first commit
    m.commits.labels("ctr", "error").inc()
    assert m.registry.get_sample_value("tidebatch_last_commit_timestamp_seconds", {"pipeline": "ctr"}) == stamp
    m.commits.labels(pipeline="ctr", result="ok").inc()
    assert m.registry.get_sample_value("tidebatch_commits_total", {"pipeline": "ctr", "result": "ok"}) == 1
    assert m.registry.get_sample_value("tidebatch_last_commit_timestamp_seconds", {"pipeline": "ctr"}) >= stamp


def test_pipeline_lag_is_the_sum_of_partition_lags():
    m = worker_metrics()
    m.lag.labels("t", "0").set(10)
    m.lag.labels("t", "3").set(5)
    assert m.registry.get_sample_value("tidebatch_pipeline_lag_messages", {"pipeline": "ctr"}) == 15
    m.lag.remove("t", "0")
    assert m.registry.get_sample_value("tidebatch_pipeline_lag_messages", {"pipeline": "ctr"}) == 5


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


def test_a_few_values_count_in_the_same_buckets_as_many() -> None:
    # observe_many counts up to FEW_VALUES values with bisect, more with numpy: the same
    # buckets for values on and between the bounds, infinity, NaN (in the sum only) and 0.
    import math
    import random

    from prometheus_client import CollectorRegistry, Histogram

    from pipeline.observe import metrics as M

    buckets = (0.001, 0.01, 0.1, 1.0)
    rng = random.Random(5)
    edge = [0.0, 0.001, 0.0011, 0.01, 0.1, 1.0, 1.0000001, 7.0, math.inf, math.nan, -1.0, 3]
    for n in (1, 2, M.FEW_VALUES - 1, M.FEW_VALUES):
        for _ in range(20):
            values = [rng.choice(edge) if rng.random() < 0.5 else rng.random() * 2 for _ in range(n)]
            few, many = (Histogram("h", "h", registry=CollectorRegistry(), buckets=buckets) for _ in range(2))
            M.observe_many(few, values)  # the bisect path
            M.observe_many(many, values * (M.FEW_VALUES // n + 1))  # the numpy path, each value k times
            k = M.FEW_VALUES // n + 1

            def counts(h: Histogram, times: int = 1) -> dict:
                return {s.labels.get("le"): s.value * times for s in h.collect()[0].samples if s.name == "h_bucket"}

            assert counts(few, k) == counts(many)
            total = next(s.value for s in few.collect()[0].samples if s.name == "h_sum")
            expected = math.fsum(values)
            assert (math.isnan(total) and math.isnan(expected)) or total == pytest.approx(expected)


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
