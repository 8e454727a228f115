"""The percentile both simulators report (this package's and
pipeline/generation/simulate.py): nearest rank, over values already sorted."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """The value at quantile q (0..1) by nearest rank; NaN for no values."""
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]
