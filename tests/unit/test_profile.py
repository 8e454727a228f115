"""`tidebatch profile` (pipeline/profiling/): the sweep on a fake timer, the fit, the
curve file through `tidebatch simulate`'s own loader, and the choice of configuration.
No real timing: the model here is a function that advances a fake clock."""

from __future__ import annotations

import json

import pytest

from pipeline.clock import FakeClock
from pipeline.config import load_config
from pipeline.profiling.fit import batch_cap, best, fit, recommended_config
from pipeline.profiling.measure import (
    Profile,
    default_settings,
    predict,
    rows_distribution,
    sim_label,
)
from pipeline.profiling.report import report_dict, write_outputs
from pipeline.profiling.stages import PythonStage
from pipeline.profiling.sweep import Point, Setting, ladder, sweep
from pipeline.simulate.curves import load_curve

SLO = {0: 50.0, 1: 100.0}


class AffineModel:
    """A model that costs a + b·rows seconds of the fake clock, plus `overhead` seconds
    outside its own time (collate, split, the wire), and records what it was given."""

    def __init__(self, clock: FakeClock, a: float, b: float, overhead: float = 0.0) -> None:
        self.clock, self.a, self.b, self.overhead = clock, a, b, overhead
        self.calls: list[list[int]] = []

    def __call__(self, batch: list[int]) -> float:
        self.calls.append(list(batch))
        own = self.a + self.b * sum(batch)
        self.clock.advance(own + self.overhead)
        return own


def _sweep(model: AffineModel, pool: list[int], counts: list[int], seconds: float = 1.0) -> list[Point]:
    return sweep(model, pool, lambda r: r, counts, model.clock.now, seconds, min_repeats=3, max_repeats=50)


# ----------------------------------------------------------------------------- sweep
def test_ladder_doubles_within_the_cap_and_ends_at_the_most_that_fit() -> None:
    assert ladder([20] * 100, 512) == [1, 2, 4, 8, 16, 25]
    assert ladder([1] * 1000, 8) == [1, 2, 4, 8]
    assert ladder([600], 512) == [1]  # one request over the cap is still measured


def test_sweep_times_each_size_with_the_injected_timer() -> None:
    model = AffineModel(FakeClock(), a=1e-4, b=1e-5, overhead=5e-5)
    points = _sweep(model, [10] * 64, [1, 4, 16])
    assert [(p.requests, p.rows) for p in points] == [(1, 10), (4, 40), (16, 160)]
    for p in points:
        assert p.model_ms == pytest.approx((1e-4 + 1e-5 * p.rows) * 1e3)
        assert p.ms == pytest.approx(p.model_ms + 0.05)  # the caller also waits for the overhead
        assert 3 <= p.repeats <= 50


def test_sweep_stays_within_its_budget_and_keeps_a_minimum_of_repeats() -> None:
    slow = AffineModel(FakeClock(), a=0.5, b=0.0)  # every call half a second
    points = _sweep(slow, [1] * 8, [1, 2], seconds=1.0)
    assert [p.repeats for p in points] == [3, 3]  # over budget, but a median needs three
    fast = AffineModel(FakeClock(), a=1 / 64, b=0.0)  # binary fractions: exact sums
    points = _sweep(fast, [1] * 8, [1, 2], seconds=0.25)
    assert [p.repeats for p in points] == [8, 8]  # 1/8 s each at 1/64 s a call


def test_sweep_walks_through_the_pool_and_does_not_count_the_first_call() -> None:
    model = AffineModel(FakeClock(), a=0.01, b=0.0)
    _sweep(model, list(range(1, 9)), [2], seconds=0.05)
    first, *timed = model.calls
    assert first == [1, 2]  # the untimed call that allocates the shape
    assert timed[:5] == [[1, 2], [3, 4], [5, 6], [7, 8], [1, 2]]


# ----------------------------------------------------------------------------- fit
def _points(a_ms: float, b_ms: float, sizes=(1, 2, 4, 8, 16, 32), rows_each: int = 16, overhead_ms: float = 0.0):
    return [Point(n, n * rows_each, a_ms + b_ms * n * rows_each + overhead_ms, a_ms + b_ms * n * rows_each, 5)
            for n in sizes]


def test_fit_recovers_the_affine_cost_of_the_executor_that_limits() -> None:
    points = _points(0.2, 0.01, overhead_ms=0.3)
    inproc = fit("m", Setting("in-process", 1), points, SLO, "test")
    assert inproc.curve.a * 1e3 == pytest.approx(0.5) and inproc.curve.b * 1e3 == pytest.approx(0.01)
    # With a model process the executors' overhead overlaps the next batch: its own time counts.
    mp = fit("m", Setting("model-process", 1), points, SLO, "test")
    assert mp.curve.a * 1e3 == pytest.approx(0.2) and mp.capacity > inproc.capacity


def test_batch_cap_is_the_largest_batch_near_the_best_rate() -> None:
    points = _points(1.0, 0.01)  # rows/s keeps rising: 16 rows 15k/s ... 512 rows 84k/s
    assert batch_cap(points, "in-process") == 512
    # Slower per row past 64 rows (a convolutional model on CPU): the cap stops there.
    slower = [p if p.rows <= 64 else Point(p.requests, p.rows, p.ms * 1.2, p.model_ms * 1.2, 5)
              for p in _points(0.0, 0.01)]
    assert batch_cap(slower, "in-process") == 64


def test_the_chosen_configuration_is_the_fastest_and_on_a_tie_the_cheapest() -> None:
    slow = fit("m", Setting("in-process", 1), _points(0.5, 0.02), SLO, "")
    fast = fit("m", Setting("in-process", 2), _points(0.5, 0.01), SLO, "")
    assert best([slow, fast]) is fast
    a = fit("m", Setting("model-process", 1), _points(0.5, 0.0100), SLO, "")
    b = fit("m", Setting("in-process", 1), _points(0.5, 0.0101), SLO, "")
    c = fit("m", Setting("in-process", 2), _points(0.5, 0.0099), SLO, "")
    assert best([a, b, c]) is b  # within 2 %: one thread, in-process
    # When the worker's Python stage is slower than every model configuration, none is
    # faster than another: the cheapest one.
    assert best([slow, fast], ceiling=min(slow.capacity, fast.capacity) / 2) is slow


def test_recommended_config_is_a_worker_config(tmp_path) -> None:
    chosen = fit("m", Setting("model-process", 2), _points(0.5, 0.01), SLO, "")
    path = tmp_path / "worker.yaml"
    path.write_text(recommended_config("ctr", chosen, "greedy", 50.0))
    cfg = load_config(path, environ={})  # the worker's own validation, key by key
    assert (cfg.pipeline, cfg.batching.policy, cfg.batching.max_batch_rows, cfg.batching.slo_ms) == (
        "ctr", "greedy", chosen.curve.max_batch_rows, 50.0)
    assert cfg.runtime.model_process is True and cfg.runtime.intra_op_threads == 2


# ----------------------------------------------------------------------------- files
def _profile(python_capacity_rows: float = 1e9) -> Profile:
    fitted = [fit("m", Setting(e, t), _points(0.5, 0.01 / t), SLO, "tidebatch profile m, test")
              for e in ("in-process", "model-process") for t in (1, 2)]
    python = PythonStage(16 / python_capacity_rows, 0.0, 0.0, 16.0)
    chosen = best(fitted, python.capacity)
    return Profile("ctr", fitted, chosen, python, "fixed:16", "cpu", "adaptive", cores=2)


def test_the_curve_file_round_trips_through_simulate_load_curve(tmp_path) -> None:
    profile = _profile()
    cfg = load_config(None, {"batching": {"slo_ms": 50, "priority_slo_ms": {1: 100}}}, environ={})
    curve_path, config_path = write_outputs(profile, tmp_path, cfg)
    curve = load_curve(str(curve_path))
    assert curve.a == pytest.approx(profile.chosen.curve.a) and curve.b == pytest.approx(profile.chosen.curve.b)
    assert curve.max_batch_rows == profile.chosen.curve.max_batch_rows
    assert curve.slo == {0: 0.05, 1: 0.1}
    doc = json.loads(curve_path.read_text())
    assert "tidebatch profile m, test" in doc["source"] and len(doc["measured"]) == len(doc["points"]) == 6
    assert [(c["executor"], c["intra_op_threads"]) for c in doc["profile"]["configurations"]] == [
        ("in-process", 1), ("in-process", 2), ("model-process", 1), ("model-process", 2)]
    assert load_config(config_path, environ={}).runtime.intra_op_threads == 2


def test_capacity_is_the_slower_stage_and_the_simulator_runs_at_loads_of_it() -> None:
    profile = _profile(python_capacity_rows=1000.0)
    assert profile.predicted_capacity == pytest.approx(1000.0) and profile.limited_by == "GIL"
    profile.loads, profile.predictions = [0.5, 0.9], predict(profile, [0.5, 0.9], quick=True)
    assert [round(r.load * profile.chosen.capacity / profile.predicted_capacity, 6)
            for r in profile.predictions] == [0.5, 0.9]
    report = report_dict(profile)
    assert [p["rows_s"] for p in report["predictions"]] == pytest.approx([500.0, 900.0])
    model_bound = _profile()
    # (2 intra-op threads on 2 cores: the cores bound, within the 16 ns of GIL work a request)
    assert model_bound.predicted_capacity == pytest.approx(model_bound.chosen.capacity, rel=1e-3)


def test_settings_and_rows_distribution() -> None:
    assert default_settings(cores=2) == [Setting("in-process", 1), Setting("in-process", 2),
                                         Setting("model-process", 1), Setting("model-process", 2)]
    assert rows_distribution([1, 1, 1]) == "fixed:1"
    assert rows_distribution([10, 20, 40]).startswith("lognormal:23.3:")


# ----------------------------------------------------------------------------- python stage
class _ToyCodec:
    """One float per request: b"0.5" -> a row; the model doubles it."""

    name = "toy"

    def decode(self, value, headers=None):
        from pipeline.codecs.base import Decoded

        return Decoded(value.decode(), 1, float(value))

    def collate(self, payloads, pad_to_rows=None):
        import numpy as np

        return {"x": np.array(payloads, dtype=np.float32)}

    def split(self, outputs, decoded):
        return [{"y": float(v)} for v in outputs["y"]]


def test_python_stage_admits_as_the_source_thread_does_and_times_with_the_injected_timer() -> None:
    from pipeline.app.compose import batch_queue, batching_params
    from pipeline.batching.concurrent import BatchQueue
    from pipeline.config import WorkerConfig
    from pipeline.profiling.stages import measure_python_stage

    class Ticks:  # every reading 1 ms after the last: each timed span is 1 ms
        t = 0.0

        def __call__(self) -> float:
            self.t += 1e-3
            return self.t

    cfg = WorkerConfig()
    params = batching_params(cfg, 512)
    queues: list[BatchQueue] = []

    def new_queue() -> BatchQueue:
        from pipeline.batching.cost import CostModel
        from pipeline.batching.registry import make_policy
        from pipeline.clock import MonotonicClock

        queues.append(batch_queue(cfg, make_policy("adaptive", **params), CostModel(), MonotonicClock(), 1, 512))
        return queues[-1]

    messages = [(f"{i / 10}".encode(), {}) for i in range(50)]
    stage = measure_python_stage(_ToyCodec(), _Model(), messages, lambda feeds: {"y": feeds["x"] * 2}, 10,
                                 Ticks(), new_queue, repeats=3)
    assert [q.rows for q in queues] == [50, 50, 50]  # every sample request queued, in a fresh queue each time
    assert stage.admit_s == pytest.approx(1e-3 / 50) and stage.collate_split_s == pytest.approx(1e-3 / 50)
    assert stage.publish_s == pytest.approx(1e-3 / 50) and stage.rows_per_request == 1.0
    assert stage.capacity == pytest.approx(1 / (3e-3 / 50))


class _Model:
    """What a result document reads of a model spec."""

    name = "toy"
    version = "1"


def test_a_configured_static_policy_is_simulated_at_the_workers_cap_and_linger() -> None:
    """Regression: `tidebatch profile ctr --policy static` measured, then failed with
    "unknown policy 'static'": the simulator knows static-64, static-tuned and
    static:ROWS:DELAY_MS, and the configured name was passed through."""
    profile = _profile(python_capacity_rows=1000.0)
    profile.policy, profile.linger_ms = "static", 5.0
    results = predict(profile, [0.5], quick=True)
    rows = profile.chosen.curve.max_batch_rows
    assert [r.policy for r in results] == [f"static:{rows}:5"]
    assert sim_label("adaptive", rows, 5.0) == "adaptive"


def test_binary_samples_are_the_same_requests_in_the_binary_form() -> None:
    # `tidebatch profile ctr --encoding binary` measures these (pipeline/commands/profile.py).
    import numpy as np

    from pipeline.codecs.ctr import CtrCodec
    from pipeline.codecs.ctr_binary import binary_samples, is_binary

    codec = CtrCodec()
    json_form, binary_form = codec.samples(7), binary_samples(codec.samples(7))
    for i in range(20):
        key, value, headers = json_form(i)
        bkey, bvalue, bheaders = binary_form(i)
        assert (bkey, bheaders) == (key, headers) and is_binary(bvalue)
        a, b = codec.decode(value), codec.decode(bvalue)
        assert (a.request_id, a.rows, a.extra) == (b.request_id, b.rows, b.extra)
        assert np.array_equal(a.payload.cat, b.payload.cat)
        assert np.array_equal(a.payload.dense, b.payload.dense, equal_nan=True)


def test_profile_encoding_binary_is_for_the_ctr_pipeline_only(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline import cli

    assert cli.main(["profile", "camera", "--encoding", "binary", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--encoding binary applies to the ctr pipeline, not 'camera'" in err
