"""Open-loop load: requests are produced on a Poisson schedule whether or not the
pipeline keeps up (a closed loop would hide queueing, the thing we measure)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator


def poisson_schedule(rate: float, count: int, seed: int = 0) -> Iterator[float]:
    """Offsets in seconds from the start for `count` Poisson arrivals at `rate`/s."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(seed)
    t = 0.0
    for _ in range(count):
        t += rng.expovariate(rate)
        yield t


def run_open_loop(
    schedule: Iterator[float],
    send: Callable[[int], None],
    idle: Callable[[float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[int, float]:
    """Call send(i) at each scheduled time (immediately when behind). `idle(seconds)`
    is called while ahead (default: sleep), e.g. to serve producer callbacks.
    Returns (sent, elapsed seconds)."""
    idle = idle or time.sleep
    start = time.monotonic()
    sent = 0
    for i, at in enumerate(schedule):
        if should_stop and should_stop():
            break
        while True:
            ahead = at - (time.monotonic() - start)
            if ahead <= 0:
                break
            idle(min(ahead, 0.01))
        send(i)
        sent += 1
    return sent, time.monotonic() - start
