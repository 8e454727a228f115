"""bench/calibration.py: the simulator's side of issue 26's calibration (item 5)."""

from __future__ import annotations

import random

import pytest

from bench import calibration
from pipeline.simulate.arrivals import Arrival
from pipeline.simulate.curves import curve_from_dict
from pipeline.simulate.trace import read_trace


def test_a_trace_written_is_the_trace_the_simulator_reads(tmp_path):
    trace = [(1700000000.25, 20, 1), (1700000000.0, 5, 0)]
    path = tmp_path / "t.jsonl"
    calibration.write_trace(path, trace)
    arr = read_trace(str(path))
    assert [(a.t, a.rows, a.priority) for a in arr] == [(0.0, 5, 0), (pytest.approx(0.25), 20, 1)]


def test_the_curve_is_fitted_to_one_median_per_batch_size():
    rng = random.Random(4)
    # Many small batches with a noisy tail, few large ones: 0.2 ms + 0.01 ms/row.
    points = [(n, 0.2 + 0.01 * n + (rng.random() * 5 if k == 0 else 0.0)) for n in (5, 10, 20) for k in range(50)]
    points += [(300, 3.2), (500, 5.2)]
    curve = curve_from_dict(calibration.fit_curve(points, 100.0))
    assert curve.a * 1e3 == pytest.approx(0.2, abs=0.01) and curve.b * 1e3 == pytest.approx(0.01, rel=0.02)
    assert curve.max_batch_rows == 512 and curve.slo == {0: 0.1, 1: 0.1}


def test_the_hop_is_the_median_of_the_rows_to_worker_stage():
    rows = [{"to_worker": {"p50_ms": p50, "p99_ms": p99}} for p50, p99 in ((8, 20), (10, 30), (9, 25))]
    assert calibration.hop_of(rows) == (9, 25)
    with pytest.raises(ValueError):
        calibration.hop_of([{"decode": {"p50_ms": 1}}])


def test_the_prediction_adds_the_hop_and_routes_only_with_adaptive():
    curve = {"a_ms": 0.2, "b_ms_per_row": 0.01, "max_batch_rows": 512, "slo_ms": {"0": 100, "1": 100}}
    quiet = [Arrival(0.005 * k, 20) for k in range(400)]  # 200 req/s, far below capacity
    p = calibration.predict(quiet, curve, "greedy", hop_ms=(8.0, 20.0), decode_us=50.0)
    assert p["in_slo_share"] == 1.0 and 8.0 < p["p50_ms"] < 12.0 and p["p99_ms"] < 40.0
    # A hop longer than the budget: greedy scores everything late, adaptive routes it.
    assert calibration.predict(quiet, curve, "greedy", hop_ms=(150.0, 200.0), decode_us=50.0)["in_slo_share"] == 0.0
    slow = calibration.predict(quiet, curve, "adaptive", hop_ms=(150.0, 200.0), decode_us=50.0)
    assert slow["routed_late"] == 400


def test_the_verdict_pairs_the_repeats_and_allows_five_percent_either_way():
    def rows(*figures):
        return [{"rep": k, "p99_ms": p99, "goodput_x_capacity": good} for k, (p99, good) in enumerate(figures)]

    # The machine got faster between repeats: each repeat's pair is what compares.
    greedy = rows((100.0, 0.50), (60.0, 0.80), (200.0, 0.20))
    adaptive = rows((104.0, 0.48), (57.0, 0.84), (150.0, 0.40))
    ratios = calibration.paired(greedy, adaptive)
    assert ratios["pairs"] == 3 and ratios["p99"] == pytest.approx(0.95) and ratios["goodput"] == pytest.approx(1.05)
    assert calibration.verdict(ratios)[0]
    assert not calibration.verdict({**ratios, "p99": 1.06})[0]
    assert not calibration.verdict({**ratios, "goodput": 0.94})[0]
    # Neither answered anything in time: a tie, not a loss.
    assert calibration.paired(rows((500.0, 0.0)), rows((110.0, 0.0)))["goodput"] == 1.0
    with pytest.raises(ValueError):
        calibration.paired(greedy, [])
    assert calibration.within(12.9, 10.0) and not calibration.within(13.1, 10.0)


def test_the_noise_of_the_model_times_is_matched_at_their_tail():
    rng = random.Random(9)
    points = [(n, (0.2 + 0.01 * n) * rng.lognormvariate(0.0, 0.5)) for n in (10, 50, 200, 500) for _ in range(2000)]
    curve = calibration.fit_curve(points, 100.0)
    assert curve["noise_sigma"] == pytest.approx(0.5, rel=0.1)
    steady = calibration.fit_curve([(n, 0.2 + 0.01 * n) for n in (10, 50, 200)], 100.0)
    assert steady["noise_sigma"] == pytest.approx(0.0, abs=1e-9)


def test_the_publisher_cost_per_result_averages_whole_millisecond_readings_out() -> None:
    """bench/calibration.py publish_us: ms from the publisher taking a batch to its last
    result, per result, summed over batches of at least 4 results (fewer are a clock
    tick or two). Batches of 10 at 50 us a result read 0 or 1 ms: the median of their
    ratios was 0, the sum is right."""
    spans = [(10, 0.0), (10, 1.0), (10, 0.0), (10, 1.0), (1, 1.0), (2, 0.0)]
    assert calibration.publish_us(spans) == pytest.approx(50.0)
    assert calibration.publish_us([(100, 3.0), (200, 5.0)]) == pytest.approx(8000.0 / 300)
    assert calibration.publish_us([(1, 1.0)]) == 0.0


def test_publish_spans_group_results_by_batch_and_end_at_the_last_one_handed_over() -> None:
    """bench/policies_scenario.py publish_spans: a batch's results share when the publisher took
    it (scored_at_ms), its rows and its model time; its span ends at the latest result
    record timestamp."""
    import numpy as np

    from bench.harness import Results
    from bench.policies_scenario import publish_spans

    docs = [{"scored_at_ms": 1000, "batch_rows": 40, "inference_ms": 2.5},
            {"scored_at_ms": 1000, "batch_rows": 40, "inference_ms": 2.5},
            {"scored_at_ms": 1003, "batch_rows": 20, "inference_ms": 1.5},
            {"request_id": "no timing"}]
    spans = publish_spans(Results(docs, np.array([1001.0, 1004.0, 1003.0, 1010.0])))
    assert sorted(spans) == [(1, 0.0), (2, 4.0)]
