"""Rows per request (or, for the generation workload, prompt and output tokens) as a
distribution named on the command line (`--rows`, `--prompt-tokens`)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import UserError

DEFAULT_ROWS = "lognormal:20:0.5"  # CTR requests: ~20 candidate items each


@dataclass(frozen=True)
class RowsDist:
    """Rows per request (or, for the generation workload, prompt and output tokens):
    fixed:N, geometric:MEAN, lognormal:MEAN:SIGMA, uniform:LO:HI, loguniform:LO:HI
    (uniform in log: as many 8-16 as 128-256, the skew of chat answers' lengths)."""

    kind: str
    p1: float
    p2: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> RowsDist:
        parts = spec.split(":")
        try:
            kind = parts[0]
            nums = [float(x) for x in parts[1:]]
            if kind == "fixed" and len(nums) == 1 and nums[0] >= 1:
                return cls(kind, nums[0])
            if kind == "geometric" and len(nums) == 1 and nums[0] >= 1:
                return cls(kind, nums[0])
            if kind == "lognormal" and len(nums) == 2 and nums[0] >= 1 and nums[1] >= 0:
                return cls(kind, nums[0], nums[1])
            if kind in ("uniform", "loguniform") and len(nums) == 2 and 1 <= nums[0] <= nums[1]:
                return cls(kind, nums[0], nums[1])
        except ValueError:
            pass
        raise UserError(
            f"bad rows distribution {spec!r}; use fixed:N, geometric:MEAN, "
            "lognormal:MEAN:SIGMA, uniform:LO:HI or loguniform:LO:HI"
        )

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.p1 + self.p2) / 2
        if self.kind == "loguniform":
            lo, hi = self.p1, self.p2
            return lo if hi == lo else (hi - lo) / math.log(hi / lo)
        return self.p1  # the others are parameterised by their (approximate) mean

    def sampler(self, rng: random.Random) -> Callable[[], int]:
        if self.kind == "fixed":
            n = int(self.p1)
            return lambda: n
        if self.kind == "geometric":
            p = 1.0 / self.p1
            log1p = math.log(1.0 - p) if p < 1 else -math.inf
            return lambda: 1 + (int(math.log(1.0 - rng.random()) / log1p) if p < 1 else 0)
        if self.kind == "lognormal":
            sigma = self.p2
            mu = math.log(self.p1) - sigma * sigma / 2  # mean of the lognormal = p1
            return lambda: max(1, round(rng.lognormvariate(mu, sigma)))
        lo, hi = int(self.p1), int(self.p2)
        if self.kind == "loguniform":
            llo, lhi = math.log(lo), math.log(hi)
            return lambda: min(hi, max(lo, round(math.exp(rng.uniform(llo, lhi)))))
        return lambda: rng.randint(lo, hi)
