"""The consumer lag per partition and its per-pipeline sum in one scrape
(pipeline/observe/metrics.py, _LagCollector): always equal, even while the source
thread moves the lag during the scrape."""

from __future__ import annotations

from prometheus_client import generate_latest

from pipeline.observe.metrics import WorkerMetrics
from pipeline.ops.stats import from_text


def _scrape(metrics: WorkerMetrics) -> tuple[float, float]:
    samples = from_text(generate_latest(metrics.registry).decode())
    return (sum(samples.get("tidebatch_consumer_lag_messages", {}).values()),
            sum(samples["tidebatch_pipeline_lag_messages"].values()))


def test_the_sum_is_the_partitions_of_the_same_scrape() -> None:
    metrics = WorkerMetrics("ctr", "adaptive")
    metrics.lag.labels("t", "0").set(3540)
    metrics.lag.labels("t", "1").set(10)
    read = metrics.lag.collect

    def read_then_move():  # noqa: ANN202 - the gauge's own collect, then the source thread's update
        families = list(read())
        metrics.lag.labels("t", "0").set(1134)
        return families

    metrics.lag.collect = read_then_move  # type: ignore[method-assign]
    assert _scrape(metrics) == (3550.0, 3550.0)
    assert _scrape(metrics) == (1144.0, 1144.0)


def test_no_partition_no_lag() -> None:
    metrics = WorkerMetrics("ctr", "adaptive")
    assert _scrape(metrics)[1] == 0.0
    metrics.lag.labels("t", "0").set(5)
    metrics.lag.remove("t", "0")
    assert _scrape(metrics)[1] == 0.0
