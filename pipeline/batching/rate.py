"""Arrival-rate estimate (rows per second) with a time-based exponential decay, so
it reads the same whether arrivals come one by one or in a burst of many."""

from __future__ import annotations

import math

# Bias correction never divides by less than this: right after the first arrival the
# observed span is too short to say anything about a rate.
_MIN_CORRECTION = 1.0 - math.exp(-0.1)


class RateEstimator:
    def __init__(self, half_life: float = 0.25) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be > 0")
        self._tau = half_life / math.log(2)
        self._rate = 0.0
        self._first: float | None = None
        self._last: float | None = None

    def observe(self, now: float, rows: int) -> None:
        if self._last is None:
            self._first = self._last = now
        self._decay_to(now)
        # Adding rows/tau keeps the estimate unbiased for a steady stream.
        self._rate += rows / self._tau

    def rate(self, now: float) -> float:
        if self._last is None or self._first is None:
            return 0.0
        dt = max(now - self._last, 0.0)
        # The decayed sum starts at zero, so for the first few half-lives it reads low
        # by a factor 1 - exp(-elapsed/tau); divide that out (bias correction), or a
        # worker that starts into an overload would not see it for seconds.
        elapsed = max(now - self._first, 0.0)
        correction = max(1.0 - math.exp(-elapsed / self._tau), _MIN_CORRECTION)
        return self._rate * math.exp(-dt / self._tau) / correction

    def _decay_to(self, now: float) -> None:
        assert self._last is not None
        dt = now - self._last
        if dt > 0:
            self._rate *= math.exp(-dt / self._tau)
            self._last = now
