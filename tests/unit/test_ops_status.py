"""`tidebatch status` (pipeline/commands/status.py): the metrics URL, the report over
workers per pipeline, no worker answering, and the same report from Prometheus's
values. No I/O."""

from __future__ import annotations

import pytest

from pipeline.ops import stats as S
from pipeline.ops import status_report as status
from tests.unit.ops_fakes import worker_metrics


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
        m = worker_metrics()
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
