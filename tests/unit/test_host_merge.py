"""The host's one ops view over its children (pipeline/ops/host_merge.py): merged
Prometheus text, liveness, readiness naming the child that is not ready, /api/stats."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from pipeline.ops import stats as S
from pipeline.ops.host_merge import (
    ChildView,
    host_liveness,
    host_readiness,
    host_worker_info,
    merge_metrics,
)

CHILD = """# HELP tidebatch_records_total Records by outcome
# TYPE tidebatch_records_total counter
tidebatch_records_total{{pipeline="ctr",outcome="scored"}} {scored}
tidebatch_records_created{{pipeline="ctr",outcome="scored"}} {created}
# HELP tidebatch_batch_rows Rows per batch
# TYPE tidebatch_batch_rows histogram
tidebatch_batch_rows_bucket{{pipeline="ctr",le="8.0"}} {b8}
tidebatch_batch_rows_bucket{{pipeline="ctr",le="+Inf"}} {binf}
tidebatch_batch_rows_count{{pipeline="ctr"}} {binf}
tidebatch_batch_rows_sum{{pipeline="ctr"}} 40.0
# HELP tidebatch_queue_rows Rows waiting
# TYPE tidebatch_queue_rows gauge
tidebatch_queue_rows{{pipeline="ctr"}} {queue}
# HELP tidebatch_slo_seconds The SLO
# TYPE tidebatch_slo_seconds gauge
tidebatch_slo_seconds{{pipeline="ctr"}} 0.1
"""


def _child(scored: float, created: float, b8: float, binf: float, queue: float) -> str:
    return CHILD.format(scored=scored, created=created, b8=b8, binf=binf, queue=queue)


def test_counters_and_histograms_sum_gauges_stay_per_process() -> None:
    text = merge_metrics([(0, _child(10, 100.0, 2, 5, 7)), (1, _child(5, 50.0, 1, 3, 4))])
    samples = S.from_text(text)
    key = (("outcome", "scored"), ("pipeline", "ctr"))
    assert samples["tidebatch_records_total"][key] == 15
    assert samples["tidebatch_records_created"][key] == 50.0  # the earliest child's
    assert samples["tidebatch_batch_rows_bucket"][(("le", "+Inf"), ("pipeline", "ctr"))] == 8
    assert samples["tidebatch_batch_rows_sum"][(("pipeline", "ctr"),)] == 80
    assert samples["tidebatch_queue_rows"] == {
        (("pipeline", "ctr"), ("process", "0")): 7, (("pipeline", "ctr"), ("process", "1")): 4}
    assert samples["tidebatch_slo_seconds"] == {(("pipeline", "ctr"),): 0.1}  # shared: one series
    # Types kept: Prometheus and the status report read a histogram as a histogram.
    kinds = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert kinds["tidebatch_batch_rows"] == "histogram" and kinds["tidebatch_records"] == "counter"


def test_status_arithmetic_reads_the_merged_host_as_the_sum() -> None:
    one = S.from_text(merge_metrics([(0, _child(10, 1.0, 2, 5, 7)), (1, _child(5, 1.0, 1, 3, 4))]))
    stats = S.window_stats(None, one, 0.0)["ctr"]
    assert stats.queue_rows == 11


def test_label_values_are_escaped() -> None:
    text = merge_metrics([(0, '# TYPE x_total counter\nx_total{a="q\\"uote"} 1\n')])
    assert S.from_text(text)["x_total"][(("a", 'q"uote'),)] == 1


def test_liveness_needs_every_child() -> None:
    assert host_liveness([ChildView(0, 1, True), ChildView(1, 2, True)])[0]
    ok, body = host_liveness([ChildView(0, 1, True), ChildView(1, None, False)])
    assert not ok and body["reason"] == "process 1 not running"
    assert not host_liveness([ChildView(0, 1, True)], supervisor_ok=False)[0]


def test_readiness_names_each_child_not_ready_and_why() -> None:
    ready = ChildView(0, 1, True, 4000, ready=(True, {"ready": True}))
    waiting = ChildView(1, 2, True, 4001, ready=(False, {"ready": False, "reason": "no partitions assigned"}))
    starting = ChildView(2, 3, True)
    ok, body = host_readiness([ready, waiting, starting])
    assert not ok
    assert body["not_ready"] == {"1": "no partitions assigned", "2": "starting: no ops port yet"}
    assert body["reason"].startswith("process 1: no partitions assigned")
    assert host_readiness([ready])[0]


def test_worker_info_sums_the_children_and_lists_each() -> None:
    def stats(assigned: list, consumed: int) -> dict:
        return {"worker": {"pipeline": "ctr", "group_id": "g", "assigned": assigned, "started": True,
                           "ready": True, "stats": {"consumed": consumed}}}

    views = [ChildView(0, 11, True, 4000, stats=stats([["t", 1]], 5)),
             ChildView(1, 12, True, 4001, restarts=1, stats=stats([["t", 0]], 7))]
    info = host_worker_info(views, True)
    assert info["assigned"] == [["t", 0], ["t", 1]] and info["stats"] == {"consumed": 12}
    assert info["started"] and info["group_id"] == "g"
    assert [(p["index"], p["pid"], p["restarts"]) for p in info["processes"]] == [(0, 11, 0), (1, 12, 1)]
