"""Issue 26, item 3: the demo's summary says whether it kept its promise (p99 under
50 ms, none late) and, when not, names the stage where the tail comes from."""

from __future__ import annotations

from pipeline.app.demo import format_summary, tail_verdict


def _summary(p99: float, late: int, stages: dict) -> dict:
    return {
        "requests_sent": 100, "invalid_sent": 0, "requests_scored": 100, "missing": 0, "duplicates": 0,
        "dead_lettered": 0, "scored_late": late, "throughput_req_s": 10.0, "throughput_rows_s": 200.0,
        "p50_ms": 5.0, "p99_ms": p99, "mean_batch_rows": 2.0, "batches": 50, "policy": "adaptive",
        "provider": "CPUExecutionProvider", "worker_exit_code": 0, "stages": stages, "where": {},
    }


def _stage(p99: float | None) -> dict:
    return {"requests": 100, "p50_ms": 1.0, "p99_ms": p99, "mean_ms": 1.0}


def test_within_the_target_says_so():
    s = _summary(31.5, 0, {"to_worker": _stage(20.0), "queue": _stage(5.0)})
    assert tail_verdict(s) == "p99 31.5 ms within the 50 ms target, none late"


def test_a_miss_names_the_stage_with_the_largest_p99():
    s = _summary(112.0, 7, {"to_worker": _stage(98.0), "queue": _stage(12.0), "model": _stage(2.0), "publish": _stage(None)})
    assert tail_verdict(s) == (
        "p99 112.0 ms over the 50 ms target, 7 late; the largest stage p99 is to_worker "
        '(98.0 ms; docs/OPERATIONS.md, "Where the time goes")'
    )
    assert "verdict" in format_summary(s) and "largest stage p99 is to_worker" in format_summary(s)


def test_late_requests_are_a_miss_even_under_the_target():
    s = _summary(40.0, 2, {"queue": _stage(30.0)})
    assert tail_verdict(s).startswith("p99 40.0 ms within the 50 ms target, 2 late; the largest stage p99 is queue")


def test_without_a_breakdown_it_says_so():
    assert tail_verdict(_summary(80.0, 0, {})) == "p99 80.0 ms over the 50 ms target, 0 late; no stage breakdown was scraped"
