"""Where one worker is in its life, shared by its rooms: created first by the
composition root (pipeline/app/compose.py) and passed to each room that reads it, so
that no room reaches back into the worker for it.

Plain attributes, read where they are needed (the source at a commit, the drain
deadline while a hand-over waits): no lock and no call on any per-record path.
"""

from __future__ import annotations

import logging
import threading
import time

from consumers.records import Source, TopicPartition

log = logging.getLogger("pipeline.worker.core")  # where the worker's other lines come from


class Lifecycle:
    """source: the Kafka consumer, set by the run loop once it has joined the group
    (None before: joining is the last step of a start).
    assigned: the partitions owned now, written by the rebalance callbacks
    (pipeline/delivery/partitions.py), read by the transactions and /readyz.
    drain_deadline: the monotonic time a shutdown must end by; None while running.
    failure: why the worker failed (the first reason), or None."""

    def __init__(self) -> None:
        self.source: Source | None = None
        self.assigned: list[TopicPartition] = []
        self.drain_deadline: float | None = None
        self.failure: str | None = None
        self._stop = threading.Event()

    def stop(self, reason: str = "stop requested") -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", reason)
        self._stop.set()

    def fail(self, reason: str) -> None:
        """Stop with an error: the worker is no longer alive or ready, and its run loop
        returns 1 (the first reason is the one reported)."""
        if self.failure is None:
            self.failure = reason
        self.stop(reason)

    @property
    def stopping(self) -> bool:
        """stop() or fail() was called: the worker is shutting down."""
        return self._stop.is_set()

    def drain(self, timeout_s: float) -> None:
        """The shutdown begins: it must end within timeout_s."""
        self.drain_deadline = time.monotonic() + timeout_s

    def drain_left(self, timeout_s: float) -> float:
        """Seconds left of the drain (timeout_s before it began)."""
        if self.drain_deadline is None:
            return timeout_s
        return max(self.drain_deadline - time.monotonic(), 0.0)
