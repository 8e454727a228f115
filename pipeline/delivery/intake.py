"""Acting on the backpressure decision (pipeline/batching/backpressure.py, pure): count
a new hold, show it on the paused gauge, and pause or resume the source's partitions.
One piece for both loops that poll Kafka, the request worker (pipeline/worker/core.py)
and the generate worker (pipeline/generation/service.py), so they hold and pause alike."""

from __future__ import annotations

import logging
from typing import Any

from consumers.records import Source
from pipeline.batching.backpressure import Backpressure, Intake, IntakeDecision
from pipeline.delivery.stats import WorkerStats

log = logging.getLogger(__name__)


def follow_intake(backpressure: Backpressure, rows: int, now: float, source: Source | None, metrics: Any,
                  pipeline: str, stats: WorkerStats, waiting: str) -> IntakeDecision:
    """The decision for `rows` waiting at `now`, acted on. metrics: the loop's
    WorkerMetrics (pauses, paused); waiting: what is waiting, a %d format for the one
    warning line when the partitions are paused ("queue at %d rows")."""
    before = backpressure.state
    intake = backpressure.step(rows, now)
    if intake.started_hold:
        metrics.pauses.labels(pipeline).inc()
        stats.count("pauses")
    if intake.state is not before:
        metrics.paused.labels(pipeline).set(0 if intake.state is Intake.OPEN else 1)
    if source is not None:
        if intake.state is Intake.PAUSED and not source.paused:
            log.warning(waiting + " and not draining: pausing the partitions", rows)
            source.pause_all()
        elif intake.state is not Intake.PAUSED and source.paused:
            source.resume_all()
    return intake
