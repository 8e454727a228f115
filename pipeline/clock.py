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


class ClockAnchor:
    """Maps Kafka timestamps (wall ms) onto a monotonic clock through one fixed
    (clock, wall ms) pair, for the worker and the Faust path alike.

    Fixed rather than re-read every poll: wall_ms() is whole milliseconds, so a fresh
    pair per poll moved the mapping by up to 1 ms from poll to poll, and two requests
    with the same timestamp polled apart could swap places under EDF. Fixed, equal
    timestamps give equal deadlines (FIFO tie-break) and later timestamps later
    deadlines, so EDF keeps the order of one camera's frames (docs/ARCHITECTURE.md).
    Re-anchored only when the two clocks drift apart by more than `drift_s`: a
    wall-clock step."""

    DRIFT_S = 0.02

    def __init__(self, drift_s: float = DRIFT_S) -> None:
        self.drift_s = drift_s
        self._anchor: tuple[float, int] | None = None

    def pair(self, now: float, now_wall_ms: int) -> tuple[float, int]:
        """The (clock, wall ms) pair to map through at this moment."""
        anchor = self._anchor
        if anchor is None or abs((now - anchor[0]) - (now_wall_ms - anchor[1]) / 1000.0) > self.drift_s:
            anchor = self._anchor = (now, now_wall_ms)
        return anchor

    @staticmethod
    def to_clock(pair: tuple[float, int], wall: float) -> float:
        """A wall-clock time (ms) on the monotonic clock, through `pair`."""
        return pair[0] + (wall - pair[1]) / 1000.0
