"""Timing a model over batch sizes, with the timer and the call passed in (pure, so the
unit tests drive it with a fake clock).

A point is n requests of the pipeline's own sample requests, collated by its codec
(pipeline/scoring.py `sample_requests`): the batches the worker would form, not
synthetic arrays. Each call takes the next n requests of the pool, so a call does not
run on rows the caches have just seen (bench/model_peak.py says how much a repeated
batch overstates a model's peak).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

EXECUTORS = ("in-process", "model-process")


@dataclass(frozen=True)
class Setting:
    """One configuration of the runtime: where ONNX Runtime runs and with how many
    intra-op threads (config `runtime.model_process`, `runtime.intra_op_threads`)."""

    executor: str  # one of EXECUTORS
    threads: int

    @property
    def label(self) -> str:
        return f"{self.executor}, {self.threads} thread{'s' if self.threads > 1 else ''}"


@dataclass(frozen=True)
class Point:
    """The median of `repeats` calls of `requests` requests (`rows` model rows)."""

    requests: int
    rows: int
    ms: float  # what the calling executor waits: collate + model + split (ScoringStep.infer)
    model_ms: float  # the session's own time (with a model process: inside that process)
    repeats: int

    def cost_ms(self, executor: str) -> float:
        """The time one batch holds the stage that limits a backlog drain. In-process,
        the executor thread collates, runs and splits, one batch after another. With a
        model process several batches are in flight (pipeline/batching/depth.py), so the
        model process runs batches back to back and the wire and the executors'
        collate/split overlap with the next batch: its own time is the cost."""
        return self.model_ms if executor == "model-process" else self.ms


def ladder(rows: Sequence[int], max_rows: int) -> list[int]:
    """Request counts 1, 2, 4, ... whose first batch stays within max_rows rows, and the
    most requests that fit in max_rows (the cap itself is the point that matters most)."""
    counts: list[int] = []
    n = 1
    while n <= len(rows) and sum(rows[:n]) <= max_rows:
        counts.append(n)
        n *= 2
    most = 0
    while most < len(rows) and sum(rows[: most + 1]) <= max_rows:
        most += 1
    if most and most not in counts:
        counts.append(most)
    return counts or [1]


def sweep(
    call: Callable[[Sequence[Any]], float],
    pool: Sequence[Any],
    rows_of: Callable[[Any], int],
    counts: Sequence[int],
    timer: Callable[[], float],
    seconds: float,
    min_repeats: int = 3,
    max_repeats: int = 200,
) -> list[Point]:
    """Time `call(requests) -> model seconds` at each request count, about
    seconds / len(counts) per count and at least min_repeats calls (after one call that
    is not counted: the first call of a shape allocates and plans)."""
    share = seconds / max(len(counts), 1)
    points = []
    for n in counts:
        batches = [pool[i : i + n] for i in range(0, len(pool) - n + 1, n)] or [pool[:n]]
        call(batches[0])
        walls: list[float] = []
        models: list[float] = []
        start = timer()
        while len(walls) < min_repeats or (timer() - start < share and len(walls) < max_repeats):
            batch = batches[len(walls) % len(batches)]
            t0 = timer()
            models.append(call(batch))
            walls.append(timer() - t0)
        used = [batches[i % len(batches)] for i in range(len(walls))]
        points.append(Point(
            requests=n, rows=round(statistics.fmean(sum(rows_of(r) for r in b) for b in used)),
            ms=statistics.median(walls) * 1e3, model_ms=statistics.median(models) * 1e3, repeats=len(walls),
        ))
    return points
