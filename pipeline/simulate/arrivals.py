"""Arrivals for the simulator: one request as produced (and, with the Kafka hop, as the
worker receives it), and the piecewise-constant Poisson process the scenarios draw."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pipeline.errors import UserError
from pipeline.simulate.rows import RowsDist


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float  # produce time, seconds
    rows: int
    priority: int = 0
    deadline: float | None = None  # absolute, may only tighten produce + SLO
    tenant: str | None = None  # scenario tenants (pipeline/simulate/tenants.py)
    sent: float | None = None  # produce time when t is the arrival at the worker (with_hops)

    @property
    def origin(self) -> float:
        """Produce time: what deadlines, ages and latencies count from."""
        return self.t if self.sent is None else self.sent


def with_hops(arrivals: Sequence[Arrival], p50_ms: float, p99_ms: float, seed: int = 1) -> list[Arrival]:
    """The arrivals as the worker receives them after the Kafka hop (produce, append,
    fetch): each delayed by a lognormal draw with this median and 99th percentile
    (a run's `to_worker` stage at low load, where it is transport, not backlog), in
    order of arrival at the worker."""
    delay = hop_sampler(p50_ms, p99_ms, seed)
    out = [Arrival(a.origin + delay(), a.rows, a.priority, a.deadline, a.tenant, a.origin) for a in arrivals]
    out.sort(key=lambda a: a.t)
    return out


def hop_sampler(p50_ms: float, p99_ms: float, seed: int = 1) -> Callable[[], float]:
    """Seconds of one Kafka hop: a lognormal draw with this median and 99th percentile
    (with_hops; the generation simulator's arrivals, pipeline/generation/simulate.py)."""
    if p50_ms <= 0 or p99_ms < p50_ms:
        raise UserError(f"hop: need 0 < p50 <= p99 ms, got {p50_ms:g}:{p99_ms:g}")
    rng = random.Random(seed + 65537)
    mu, sigma = math.log(p50_ms / 1e3), math.log(p99_ms / p50_ms) / 2.3263  # z of the 99th percentile
    return lambda: rng.lognormvariate(mu, sigma)



def poisson_arrivals(
    segments: Sequence[tuple[float, float, float]],
    rows: RowsDist,
    capacity: float,
    seed: int,
    high_share: float | None = None,
) -> list[Arrival]:
    """Piecewise-constant Poisson process: each segment (start, end, load) produces
    load × capacity rows/s on average, in requests of `rows` rows."""
    rng = random.Random(seed)
    draw = rows.sampler(random.Random(seed + 7919))
    prio_rng = random.Random(seed + 104729)
    out: list[Arrival] = []
    for start, end, load in segments:
        rate = load * capacity / rows.mean  # requests/s
        if rate <= 0:
            continue
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            prio = 0 if high_share is None else (0 if prio_rng.random() < high_share else 1)
            out.append(Arrival(t, draw(), prio))
    return out
