"""`tidebatch profile generate` (pipeline/generation/profile.py): the step cost fit on
synthetic points, the grid's bounds, and one real profile of the shipped decoder on a
tiny grid whose curve file `tidebatch simulate --workload generate` then runs on. No
timing is asserted: only that the measured terms are what a curve may hold."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.errors import UserError
from pipeline.generation.cost import load_step_cost
from pipeline.generation.profile import Grid, StepPoint, fit_step_cost, median_steps

A, B, C, P = 2e-4, 3e-5, 4e-7, 2e-5  # seconds: step, sequence, context token, prefill token


def _grid_points(a: float = A, b: float = B, c: float = C, p: float = P, noise: float = 0.0,
                 seed: int = 0) -> list[StepPoint]:
    """The points a profile's cells give: decoding steps of n sequences at context n·L,
    prefill steps of n·L tokens; times from the curve, times lognormal noise."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (1, 4, 16):
        for length in (16, 96, 192):
            for decoded, context, prefilled in ((n, n * (length + 4), 0), (0, 0, n * length)):
                t = a + b * decoded + c * context + p * prefilled
                out.append(StepPoint(decoded, context, prefilled, t * float(rng.lognormal(0.0, noise))))
    return out


def test_the_fit_recovers_the_terms_of_exact_points() -> None:
    fit = fit_step_cost(_grid_points())
    assert (fit.a, fit.b, fit.c, fit.p) == pytest.approx((A, B, C, P), rel=1e-6)
    assert fit.dropped == ()
    assert fit.predict(StepPoint(8, 800, 40, 0.0)) == pytest.approx(A + 8 * B + 800 * C + 40 * P)


def test_the_fit_weighs_each_point_by_its_own_size() -> None:
    """One 10 % error on the largest prefill moves the small decoding steps' terms
    little (relative least squares); plain least squares would bend them to it."""
    points = _grid_points()
    big = max(points, key=lambda q: q.seconds)
    skewed = [StepPoint(q.decoded, q.context, q.prefilled, q.seconds * 1.1) if q is big else q for q in points]
    fit = fit_step_cost(skewed)
    assert fit.a == pytest.approx(A, rel=0.1)
    assert fit.b == pytest.approx(B, rel=0.1)


def test_the_fit_on_noisy_points_stays_near_the_terms() -> None:
    for seed in range(5):
        fit = fit_step_cost(_grid_points(noise=0.03, seed=seed))
        assert fit.a == pytest.approx(A, rel=0.2)
        assert fit.b == pytest.approx(B, rel=0.2)
        assert fit.p == pytest.approx(P, rel=0.1)
        assert fit.c >= 0.0


def test_a_term_that_fits_negative_is_held_at_zero_and_the_rest_refitted() -> None:
    """Steps that cost less the longer their context (noise on a context term too small
    to see): the context term is held at 0, the others fitted without it."""
    points = [StepPoint(q.decoded, q.context, q.prefilled, q.seconds - 1e-7 * q.context)
              for q in _grid_points(c=0.0)]
    fit = fit_step_cost(points)
    assert fit.c == 0.0
    assert fit.dropped == ("context",)
    assert min(fit.a, fit.b, fit.p) > 0.0


def test_the_fit_refuses_too_few_or_bad_points() -> None:
    with pytest.raises(UserError, match="needs >= 4 points"):
        fit_step_cost(_grid_points()[:3])
    with pytest.raises(UserError, match="finite"):
        fit_step_cost([*_grid_points()[:5], StepPoint(1, 10, 0, math.nan)])
    with pytest.raises(UserError, match="> 0"):
        fit_step_cost([*_grid_points()[:5], StepPoint(1, 10, 0, 0.0)])


def test_a_cells_step_is_its_median_over_the_rounds_that_ran_it() -> None:
    rounds = [[StepPoint(0, 0, 64, 5.0), StepPoint(4, 68, 0, 1.0)],
              [StepPoint(0, 0, 64, 9.0), StepPoint(4, 68, 0, 3.0)],
              [StepPoint(0, 0, 64, 6.0), StepPoint(3, 51, 0, 99.0)]]  # another shape: not this step's time
    assert median_steps(rounds) == [StepPoint(0, 0, 64, 6.0), StepPoint(4, 68, 0, 2.0)]


def test_the_grid_is_held_to_the_slots_and_the_context() -> None:
    assert Grid((1, 4, 16), (16, 96), 8).check(slots=8, context=256).batches == (1, 4, 8)
    with pytest.raises(UserError, match="context"):
        Grid((1, 4), (16, 240), 8).check(slots=16, context=256)  # continuous cells ask for up to 3 x 8 tokens
    with pytest.raises(UserError, match=">= 2 sequence counts"):
        Grid((16, 32), (16, 96), 8).check(slots=16, context=256)  # both capped to 16
    with pytest.raises(UserError, match=">= 1"):
        Grid((1, 4), (16, 96), 0).check(slots=16, context=256)


def test_profile_generate_refuses_the_batch_profiles_flags(capsys) -> None:
    assert main(["profile", "generate", "--policy", "adaptive"]) == 2
    assert "leave out" in capsys.readouterr().err


@pytest.mark.parametrize("gathered", [False, True])
def test_a_real_profile_of_the_shipped_decoder_writes_a_curve_the_simulator_runs(tmp_path, capsys,
                                                                                  gathered: bool) -> None:
    """In-place decoding (what the runner uses here) and the gathered fallback: real
    decoding steps on a tiny grid, one round; the file loads as a generation curve with
    finite, non-negative terms, and `tidebatch simulate --workload generate` runs on it."""
    out = tmp_path / "gen"
    argv = ["profile", "generate", "--quick", "--seconds", "0.01", "--max-slots", "4", "--sequences", "1,3",
            "--prompt-tokens", "8,24", "--decode-steps", "3", "-o", str(out)] + (["--gathered"] if gathered else [])
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "t(step) = " in printed
    doc = json.loads((out / "curve.json").read_text())
    assert doc["kind"] == "generation" and doc["assumed"] is False
    assert ("gathered" if gathered else "in place") in doc["description"]
    cells = {(c["policy"], c["sequences"], c["prompt_tokens"]): c for c in doc["fit"]["cells"]}
    assert set(cells) == {(p, n, k) for p in ("static", "continuous") for n in (1, 3) for k in (8, 24)}
    assert all(c["steps"] == 3 + 1 for (p, _, _), c in cells.items() if p == "static")  # a prefill, 3 decodes
    assert all(c["steps"] > 3 + 1 for (p, _, _), c in cells.items() if p == "continuous")  # 2n requests
    cost = load_step_cost(str(out / "curve.json"))
    terms = (cost.a, cost.b, cost.c, cost.p)
    assert all(math.isfinite(t) and t >= 0.0 for t in terms), terms
    assert cost.a + cost.b > 0.0 and cost.p > 0.0  # a prefill of 72 tokens costs more than one of 8
    assert (cost.max_slots, cost.max_tokens) == (4, 4 * 256)
    assert cost.counts == ("live" if gathered else "computed")  # the in-place call computes its slot range
    assert main(["simulate", "--workload", "generate", "--curve", str(out / "curve.json"), "--duration", "1",
                 "--load", "0.5", "--no-saturation", "--policies", "continuous", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["curve"]["name"] == doc["name"]
    assert sim["results"][0]["finished"] > 0


def test_the_generate_flags_are_refused_for_a_batch_pipeline(capsys) -> None:
    assert main(["profile", "ctr", "--gathered"]) == 2
    assert "--gathered is for `tidebatch profile generate` only" in capsys.readouterr().err
    assert main(["profile", "generate", "--max-slots", "0"]) == 2
    assert ">= 1" in capsys.readouterr().err
