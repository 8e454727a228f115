"""Online cost model t(n) ≈ a + b·n per shape bucket.

Fitted by weighted least squares (relative errors) with exponential forgetting, kept as decayed sufficient
statistics (Σw, Σw·n, Σw·n², Σw·t, Σw·n·t), so it follows a model whose cost drifts
(thermal throttling, a neighbour on the GPU) without a window of raw samples. The 2x2
normal equations are solved on every update: this is what recursive least squares
computes, without RLS's covariance matrix, whose scale has to match the measurement
noise (a covariance in seconds² against an implicit unit noise variance barely moves
off the prior) and which winds up when every batch has the same size.

The prior (a warm-up profile, or a default) enters as two pseudo-observations whose
weight decays: they give way to data within a few dozen batches, yet keep the a/b split
determined while every observed batch has the same size (a static policy at
saturation).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

# Smallest per-row cost the model reports: a batch is never free.
_MIN_B = 1e-9
# Floor for the 1/t² weights, so a zero-cost prediction does not divide by zero.
_MIN_T = 1e-7


@dataclass(slots=True)
class AffineCost:
    a: float  # seconds per call
    b: float  # seconds per row

    def predict(self, rows: float) -> float:
        return self.a + self.b * rows

    def batching_pays(self, min_gain: float = 0.1) -> bool:
        """True when a call of 8 rows is cheaper, per row, than 8 calls of one row by
        at least min_gain. False for t(n) ≈ b·n (convolutional models on CPU)."""
        eight = self.predict(8)
        return eight < (1.0 - min_gain) * 8 * self.predict(1)


class _Fit:
    """Decayed least-squares statistics of one bucket, plus the prior's pseudo-points."""

    __slots__ = ("s0", "s1", "s2", "t0", "t1", "n", "lam", "cost", "prior", "pw", "pw0", "ref", "fl")

    # The prior's weight decays faster than the data's (a prior far off, say a default
    # ten times too slow, would otherwise hold the fit for hundreds of batches). It only
    # stays, at PRIOR_FLOOR of where it began, while the data alone cannot split a from
    # b (every batch the same size): there it keeps the fit determined.
    PRIOR_DECAY = 0.9  # per batch: mostly gone after a few dozen batches
    PRIOR_FLOOR = 1e-3
    # Data whose normal matrix is this close to singular (relative) cannot split a, b.
    DEGENERATE = 1e-6

    def __init__(self, prior: AffineCost, lam: float, prior_weight: float, ref_rows: int) -> None:
        self.lam = lam
        self.n = 0
        # Prior pseudo-observations at n=1 and n=ref_rows (see _floor); their weight decays
        # (see PRIOR_DECAY), but not below a floor while the data are degenerate.
        self.s0 = self.s1 = self.s2 = self.t0 = self.t1 = 0.0
        self.prior = prior
        self.pw = self.pw0 = prior_weight
        self.ref = float(ref_rows)
        self.fl = self._floor()  # per unit of prior weight
        self.cost = prior

    def update(self, rows: float, seconds: float) -> None:
        lam = self.lam
        w = self.weight(seconds)
        self.s0 = self.s0 * lam + w
        self.s1 = self.s1 * lam + w * rows
        self.s2 = self.s2 * lam + w * rows * rows
        self.t0 = self.t0 * lam + w * seconds
        self.t1 = self.t1 * lam + w * rows * seconds
        self.n += 1
        self.pw *= self.PRIOR_DECAY
        self.cost = self._solve()

    @staticmethod
    def weight(seconds: float) -> float:
        """Relative weight of a sample: 1/t². Service-time noise is multiplicative;
        without these weights the big batches' absolute noise swamps the intercept a.
        Each sample is weighted by its own size (a weight from the prior's shape
        misweights the data whenever the prior's a/b is off), which biases the fit low
        by about 2σ² (2 % at 10 % noise): well inside the policies' safety margin."""
        return 1.0 / max(seconds, _MIN_T) ** 2

    def _floor(self) -> list[float]:
        """(Σw, Σw·n, Σw·n², Σw·t, Σw·n·t) of the prior's two pseudo-points, per unit
        of prior weight."""
        out = [0.0] * 5
        for x in (1.0, self.ref):
            y = self.prior.predict(x)
            w = self.weight(y)
            for i, v in enumerate((1.0, x, x * x, y, x * y)):
                out[i] += w * v
        return out

    def _solve(self) -> AffineCost:
        pw = self.pw
        if self.s0 * self.s2 - self.s1 * self.s1 <= self.DEGENERATE * self.s0 * self.s2:
            pw = max(pw, self.PRIOR_FLOOR * self.pw0)
        f0, f1, f2, g0, g1 = (pw * v for v in self.fl)
        s0, s1, s2 = self.s0 + f0, self.s1 + f1, self.s2 + f2
        t0, t1 = self.t0 + g0, self.t1 + g1
        det = s0 * s2 - s1 * s1
        if det > 0:
            a = (s2 * t0 - s1 * t1) / det
            b = (s0 * t1 - s1 * t0) / det
            if a >= 0 and b >= _MIN_B:
                return AffineCost(a, b)
        # The unconstrained optimum lies outside a >= 0, b >= _MIN_B (noise): the best
        # constrained fit lies on one of the two edges; keep the better one.
        best: tuple[float, AffineCost] | None = None
        for cand in (
            AffineCost(0.0, max(t1 / s2, _MIN_B)),  # through the origin
            AffineCost(max((t0 - _MIN_B * s1) / s0, 0.0), _MIN_B),  # flat
        ):
            a, b = cand.a, cand.b
            # Weighted residual sum of squares, up to a constant.
            sse = a * a * s0 + 2 * a * b * s1 + b * b * s2 - 2 * (a * t0 + b * t1)
            if best is None or sse < best[0]:
                best = (sse, cand)
        assert best is not None
        return best[1]


class CostModel:
    """Per-bucket affine cost, never negative, refitted from observed batches.

    prior: the cost assumed before a bucket has data (seeded by a warm-up profile).
    forgetting: per-batch decay of old observations (0.995 ≈ the last 200 batches).
    prior_weight: how many batches the prior is worth at each of its two points.
    ref_rows: batch size of the prior's second point (its first is one row).
    """

    def __init__(
        self,
        prior: AffineCost | None = None,
        forgetting: float = 0.995,
        prior_weight: float = 2.0,
        ref_rows: int = 64,
    ) -> None:
        if not 0.0 < forgetting <= 1.0:
            raise ValueError("forgetting must be within (0, 1]")
        if prior_weight <= 0:
            raise ValueError("prior_weight must be > 0")
        self._prior = prior or AffineCost(a=1e-3, b=1e-4)
        self._lam = forgetting
        self._prior_weight = prior_weight
        self._ref_rows = max(int(ref_rows), 2)
        self._fits: dict[Hashable, _Fit] = {}

    def _new_fit(self, cost: AffineCost) -> _Fit:
        return _Fit(cost, self._lam, self._prior_weight, self._ref_rows)

    def restart(self, prior: AffineCost) -> None:
        """Forget every bucket's fit and start again from `prior` (a new model version's
        warm-up profile: the old version's batches say nothing about its cost)."""
        self._prior = prior
        self._fits.clear()

    def seed(self, bucket: Hashable, cost: AffineCost) -> None:
        """Start a bucket from a known cost (its own warm-up profile)."""
        self._fits[bucket] = self._new_fit(cost)

    def observe(self, bucket: Hashable, rows: int, seconds: float) -> None:
        if seconds < 0 or rows < 0:
            return  # a clock hiccup; not a measurement
        fit = self._fits.get(bucket)
        if fit is None:
            fit = self._fits[bucket] = self._new_fit(self._prior)
        fit.update(float(rows), float(seconds))

    def cost(self, bucket: Hashable) -> AffineCost:
        fit = self._fits.get(bucket)
        return self._prior if fit is None else fit.cost

    def predict(self, bucket: Hashable, rows: int) -> float:
        return self.cost(bucket).predict(rows)

    def observations(self, bucket: Hashable) -> int:
        fit = self._fits.get(bucket)
        return fit.n if fit else 0
