"""Clocks. The batching core never reads time itself: it is handed a clock, so unit
tests and the simulator drive it with a fake one (the way TensorFlow's batching_util
takes an Env)."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._t += seconds

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError("a clock cannot go backwards")
        self._t = t


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch, the unit of Kafka timestamps."""
    return time.time_ns() // 1_000_000
