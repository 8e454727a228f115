"""The arithmetic of bench/delivery.py (bench/delivery_cells.py, bench/rounds.py; no
broker, no timing): when a drain ends for a read_committed reader, medians over runs,
the ratio table, the case order per round."""

from __future__ import annotations

import pytest

from bench.delivery_cells import (
    ALO,
    EOS,
    disturbed,
    drain_rates,
    latency_summary,
    modes,
    ratios,
    summarise,
    undisturbed,
)
from bench.rounds import rotated


def test_at_least_once_drain_ends_at_the_last_result() -> None:
    r = drain_rates(1000, 20_000, first_ts_ms=0.0, last_ts_ms=500.0, committed_ms=700.0, delivery=ALO)
    assert r["requests_per_s"] == pytest.approx(2000.0)
    assert r["produced_requests_per_s"] == pytest.approx(2000.0)
    assert r["final_commit_wait_ms"] == 0.0


def test_exactly_once_drain_ends_at_the_last_commit() -> None:
    r = drain_rates(1000, 20_000, first_ts_ms=0.0, last_ts_ms=500.0, committed_ms=1000.0, delivery=EOS)
    assert r["requests_per_s"] == pytest.approx(1000.0)  # readable only after the commit
    assert r["rows_per_s"] == pytest.approx(20_000.0)
    assert r["produced_requests_per_s"] == pytest.approx(2000.0)
    assert r["final_commit_wait_ms"] == pytest.approx(500.0)


def test_exactly_once_commit_seen_before_the_last_timestamp_counts_from_the_timestamp() -> None:
    # the offsets poll and the result timestamps come from different clocks' reads
    r = drain_rates(1000, 20_000, first_ts_ms=0.0, last_ts_ms=500.0, committed_ms=490.0, delivery=EOS)
    assert r["requests_per_s"] == pytest.approx(2000.0)
    assert r["final_commit_wait_ms"] == 0.0


def test_exactly_once_drain_needs_a_commit_time() -> None:
    with pytest.raises(ValueError):
        drain_rates(1, 1, 0.0, 1.0, None, EOS)


def test_summarise_takes_medians_and_keeps_every_run() -> None:
    runs = [{"requests_per_s": v, "txn_markers": i} for i, v in enumerate([300.0, 100.0, 200.0, 400.0])]
    s = summarise(runs, ("requests_per_s",))
    assert s["requests_per_s"] == pytest.approx(250.0)
    assert s["runs_requests_per_s"] == [300.0, 100.0, 200.0, 400.0]
    assert s["txn_markers"] in (0, 2)  # from a run nearest the median


def test_latency_summary_counts_missing_and_the_commit_wait() -> None:
    s = latency_summary([110.0, 120.0, 130.0], [10.0, 20.0, 30.0], sent=4, duplicates=1)
    assert (s["results"], s["missing"], s["duplicates"]) == (3, 1, 1)
    assert s["p50_ms"] == pytest.approx(120.0)
    assert s["p50_produced_ms"] == pytest.approx(20.0)
    assert s["mean_commit_wait_ms"] == pytest.approx(100.0)
    assert latency_summary([], [], sent=5, duplicates=0)["missing"] == 5


def test_ratios_against_at_least_once() -> None:
    labels = [m.label for m in modes([20, 500])]
    assert labels == [ALO, f"{EOS} 20 ms", f"{EOS} 500 ms"]
    sat = {label: {"requests_per_s": v, "produced_requests_per_s": v} for label, v in zip(labels, [1000, 900, 700], strict=True)}
    lat = {labels[0]: {"p50_ms": 50.0, "p99_ms": 200.0}, labels[1]: {"p50_ms": 75.0, "p99_ms": 300.0}}
    rows = {r["mode"]: r for r in ratios({"saturation": sat, "latency": lat})}
    assert rows[labels[1]]["saturation"] == pytest.approx(0.9)
    assert rows[labels[1]]["meets_target"]
    assert rows[labels[1]]["p50"] == pytest.approx(1.5)
    assert not rows[labels[2]]["meets_target"]
    assert "p50" not in rows[labels[2]]  # no latency run for that mode


def test_each_round_starts_one_case_later() -> None:
    assert [rotated([1, 2, 3], k) for k in range(4)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 2, 3]]


def test_a_run_sharing_the_machine_is_disturbed() -> None:
    assert not disturbed({"cpu_cores": {"worker": 1.9, "others": 0.05, "stolen": 0.0}})
    assert disturbed({"cpu_cores": {"worker": 0.9, "others": 0.6, "stolen": 0.0}})
    assert disturbed({"cpu_cores": {"worker": 0.9, "others": 0.1, "stolen": 0.3}})
    assert not disturbed({})


def test_disturbed_runs_are_measured_again_and_the_last_is_kept() -> None:
    runs = iter([{"cpu_cores": {"others": 0.9}, "n": 1}, {"cpu_cores": {"others": 0.0}, "n": 2}])
    redone: list[dict] = []
    got = undisturbed(lambda: next(runs), lambda r: None, retries=2, redone=redone)
    assert got["n"] == 2 and [r["n"] for r in redone] == [1]
    always = iter([{"cpu_cores": {"others": 0.9}, "n": i} for i in range(3)])
    redone = []
    got = undisturbed(lambda: next(always), lambda r: None, retries=1, redone=redone)
    assert got["n"] == 1 and disturbed(got) and len(redone) == 1  # kept, and flagged
