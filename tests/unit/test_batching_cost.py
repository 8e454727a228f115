"""The online cost model t(n) = a + b·n and the arrival-rate estimator."""

from __future__ import annotations

import random

import pytest

from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.rate import RateEstimator


def feed(model: CostModel, a: float, b: float, n_batches: int, seed: int = 1, bucket=0, noise=0.1) -> None:
    rng = random.Random(seed)
    for _ in range(n_batches):
        n = rng.choice([4, 16, 64, 256, 512])
        model.observe(bucket, n, (a + b * n) * rng.lognormvariate(-noise * noise / 2, noise))


@pytest.mark.parametrize(
    "prior",
    [None, AffineCost(a=0.01, b=1e-3), AffineCost(a=1e-5, b=1e-7)],
    ids=["default-prior", "prior-10x-slow", "prior-100x-fast"],
)
@pytest.mark.parametrize("a,b", [(0.095e-3, 0.035e-3), (5e-3, 1e-5)], ids=["ctr-cpu", "gpu-like"])
def test_converges_to_a_known_curve_from_noisy_samples(prior, a, b):
    model = CostModel(prior=prior)
    feed(model, a, b, 400)
    fit = model.cost(0)
    # b·n is at most half of t on the GPU-like curve: b is the noisier parameter.
    assert fit.b == pytest.approx(b, rel=0.1)
    assert fit.a == pytest.approx(a, rel=0.3, abs=0.03 * (a + 64 * b))
    for n in (1, 64, 512):  # what decisions use: predictions across sizes
        assert model.predict(0, n) == pytest.approx(a + b * n, rel=0.1)
    assert model.observations(0) == 400


def test_gives_way_to_data_within_a_few_dozen_batches():
    model = CostModel(prior=AffineCost(a=0.01, b=1e-3))  # 10x too slow
    feed(model, 2e-3, 2e-6, 40)
    assert model.predict(0, 256) == pytest.approx(2e-3 + 2e-6 * 256, rel=0.15)


def test_never_negative():
    model = CostModel()
    for n in (10, 20, 40, 80) * 20:  # data that fits a negative intercept
        model.observe(0, n, max(1e-6 * n - 5e-5, 1e-7))
    fit = model.cost(0)
    assert fit.a >= 0 and fit.b > 0
    neg = CostModel()
    for n in (10, 20, 40, 80) * 20:  # and a falling curve: a negative slope
        neg.observe(0, n, 1e-3 - 1e-6 * n)
    fit = neg.cost(0)
    assert fit.a >= 0 and fit.b > 0
    assert all(neg.predict(0, n) > 0 for n in (1, 100, 10_000))


def test_buckets_are_fitted_separately_and_a_new_one_starts_from_the_prior():
    prior = AffineCost(a=1e-3, b=1e-4)
    model = CostModel(prior=prior)
    feed(model, 1e-3, 1e-5, 300, bucket=("len", 16))
    feed(model, 4e-3, 8e-5, 300, bucket=("len", 128), seed=2)
    assert model.cost(("len", 16)).b == pytest.approx(1e-5, rel=0.1)
    assert model.cost(("len", 128)).b == pytest.approx(8e-5, rel=0.1)
    assert model.cost(("len", 64)) == prior and model.observations(("len", 64)) == 0


def test_seed_starts_a_bucket_from_its_own_profile():
    model = CostModel()
    model.seed("img", AffineCost(a=0.0, b=0.0375))
    assert model.predict("img", 4) == pytest.approx(0.15)


def test_same_size_batches_keep_the_prediction_right_and_the_fit_sane():
    model = CostModel()
    for _ in range(500):  # a static policy at saturation: every batch 512 rows
        model.observe(0, 512, 0.018)
    fit = model.cost(0)
    assert model.predict(0, 512) == pytest.approx(0.018, rel=0.01)
    assert fit.a >= 0 and fit.b > 0


def test_follows_a_drifting_cost():
    model = CostModel()
    feed(model, 1e-3, 1e-5, 300)
    feed(model, 2e-3, 2e-5, 600, seed=3)  # the GPU got a noisy neighbour
    assert model.predict(0, 256) == pytest.approx(2e-3 + 2e-5 * 256, rel=0.1)


def test_batching_pays():
    assert AffineCost(a=2e-3, b=2e-6).batching_pays()
    assert AffineCost(a=0.095e-3, b=0.035e-3).batching_pays()
    assert not AffineCost(a=0.0, b=37.5e-3).batching_pays()


def test_cost_model_validates():
    with pytest.raises(ValueError):
        CostModel(forgetting=0.0)
    with pytest.raises(ValueError):
        CostModel(prior_weight=0.0)


# ---------------------------------------------------------------------------- rate
def test_rate_of_a_steady_stream():
    est = RateEstimator(half_life=0.25)
    t = 0.0
    while t < 2.0:
        est.observe(t, 20)
        t += 0.001  # 20 rows per ms
    assert est.rate(t) == pytest.approx(20_000, rel=0.05)


def test_rate_is_right_soon_after_start_bias_corrected():
    est = RateEstimator(half_life=1.0)
    t = 0.0
    while t < 0.3:
        est.observe(t, 10)
        t += 0.001
    assert est.rate(t) == pytest.approx(10_000, rel=0.1)


def test_rate_reads_the_same_for_a_burst_and_a_spread():
    spread, burst = RateEstimator(0.25), RateEstimator(0.25)
    for k in range(1000):
        spread.observe(k * 0.001, 5)
        if k % 100 == 0:
            burst.observe(k * 0.001, 500)  # the same rows, 100 at a time
    assert burst.rate(1.0) == pytest.approx(spread.rate(1.0), rel=0.25)


def test_rate_decays_when_arrivals_stop():
    est = RateEstimator(half_life=0.25)
    for k in range(1000):
        est.observe(k * 0.001, 10)
    r = est.rate(1.0)
    assert est.rate(1.25) == pytest.approx(r / 2, rel=0.05)  # one half-life later
    assert RateEstimator().rate(5.0) == 0.0
    with pytest.raises(ValueError):
        RateEstimator(half_life=0.0)
