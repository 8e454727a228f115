"""The simulator's scenarios: a named shape of load over time (poisson, onoff,
diurnal, burst, overload, priorities) or a recorded trace, turned into the arrivals of
one run and the windows its metrics look at. Load is relative to the curve's capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.errors import UserError
from pipeline.simulate.arrivals import Arrival, poisson_arrivals, with_hops
from pipeline.simulate.curves import Curve
from pipeline.simulate.rows import DEFAULT_ROWS, RowsDist
from pipeline.simulate.trace import read_trace

# Fixed scenario shapes (load relative to capacity), from the issues.
BURST_BASE, BURST_PEAK, BURST_LEN, BURST_START = 0.5, 1.5, 10.0, 2.0
OVERLOAD_LOAD = 1.2
PRIORITIES_LOAD, PRIORITIES_HIGH_SHARE = 1.1, 0.2

# Simulated seconds per scenario when --duration is not given: long enough for the
# burst's recovery, and for a 20 000-row queue to fill at 110 % (priorities).
DEFAULT_DURATION = {"burst": 25.0, "overload": 10.0, "priorities": 20.0}
STEADY_DURATION = 10.0


def default_duration(scenario: str) -> float:
    return DEFAULT_DURATION.get(scenario.split(":")[0], STEADY_DURATION)



@dataclass
class Workload:
    """What a scenario produces: arrivals plus the windows the metrics look at."""

    name: str
    arrivals: list[Arrival]
    duration: float
    load: float | None = None  # steady load, relative to capacity, where one applies
    burst: tuple[float, float] | None = None  # [start, end) of a burst window
    segments: list[tuple[float, float, float]] = field(default_factory=list)



def _scenario_segments(name: str, load: float, duration: float) -> tuple[list, tuple | None]:
    if name == "poisson":
        return [(0.0, duration, load)], None
    if name.startswith("onoff"):
        # onoff[:ON_S:OFF_S]: bursts at load × (on+off)/on, silence in between: mean = load.
        parts = name.split(":")[1:]
        try:
            on, off = (float(parts[0]), float(parts[1])) if parts else (1.0, 1.0)
        except (IndexError, ValueError):
            on = off = -1.0
        if on <= 0 or off < 0 or len(parts) not in (0, 2):
            raise UserError(f"bad scenario {name!r}; use onoff or onoff:ON_S:OFF_S")
        peak = load * (on + off) / on
        segs, t = [], 0.0
        while t < duration:
            segs.append((t, min(t + on, duration), peak))
            t += on + off
        return segs, None
    if name == "diurnal":
        # One "day" compressed into the run: from 20 % to 180 % of the mean load and back.
        step = max(duration / 200, 0.05)
        segs, t = [], 0.0
        while t < duration:
            mid = t + step / 2
            segs.append((t, min(t + step, duration), load * (1 - 0.8 * math.cos(2 * math.pi * mid / duration))))
            t += step
        return segs, None
    if name == "burst":
        end = BURST_START + BURST_LEN
        if duration <= end:
            raise UserError(f"scenario burst needs --duration > {end:g} s (a {BURST_LEN:g} s burst at {BURST_START:g} s)")
        return [
            (0.0, BURST_START, BURST_BASE),
            (BURST_START, end, BURST_PEAK),
            (end, duration, BURST_BASE),
        ], (BURST_START, end)
    if name == "overload":
        return [(0.0, duration, OVERLOAD_LOAD)], None
    if name == "priorities":
        return [(0.0, duration, PRIORITIES_LOAD)], None
    raise UserError(
        f"unknown scenario {name!r}; use poisson, onoff[:ON:OFF], diurnal, burst, overload, "
        "priorities or trace:FILE"
    )


def make_workload(
    scenario: str,
    curve: Curve,
    *,
    load: float = 0.5,
    duration: float = 20.0,
    rows: RowsDist | str = DEFAULT_ROWS,
    seed: int = 1,
    hop_ms: tuple[float, float] | None = None,
) -> Workload:
    """Arrivals for a named scenario (load applies to poisson, onoff and diurnal);
    hop_ms (p50, p99): the Kafka hop before the worker (with_hops)."""
    if isinstance(rows, str):
        rows = RowsDist.parse(rows)
    if scenario.startswith("trace:"):
        arrivals = read_trace(scenario[len("trace:"):])
        if not arrivals:
            raise UserError(f"{scenario}: the trace has no records")
        # The span of production (at least 1 ms, so rates stay finite).
        duration = max(arrivals[-1].t, 1e-3)
        if hop_ms is not None:
            arrivals = with_hops(arrivals, *hop_ms, seed=seed)
        return Workload(scenario, arrivals, duration=duration)
    if duration <= 0:
        raise UserError("--duration must be > 0")
    segments, burst = _scenario_segments(scenario, load, duration)
    high_share = PRIORITIES_HIGH_SHARE if scenario == "priorities" else None
    arrivals = poisson_arrivals(segments, rows, curve.capacity, seed, high_share)
    if hop_ms is not None:
        arrivals = with_hops(arrivals, *hop_ms, seed=seed)
    steady = load if is_steady(scenario) else None
    return Workload(scenario, arrivals, duration, steady, burst, list(segments))


def is_steady(scenario: str) -> bool:
    """Scenarios that take --load (the others have their load built in)."""
    return scenario == "poisson" or scenario == "diurnal" or scenario.startswith("onoff")

