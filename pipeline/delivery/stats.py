"""The worker's counters, shared by its threads (the stats line, /api/stats, tests)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerStats:
    consumed: int = 0
    scored: int = 0
    scored_late: int = 0
    routed_late: int = 0
    dlq: int = 0
    undeliverable: int = 0  # no outcome could be written (limits.on_undeliverable: skip)
    duplicates: int = 0
    batches: int = 0
    batch_rows: int = 0
    commits: int = 0
    aborts: int = 0  # delivery exactly_once: transactions aborted
    pauses: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Not a field: repr, equality and asdict() are about the counts.
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        """Add n to one counter, from any thread."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def count_many(self, **counts: int) -> None:
        """Add to several counters at once, from any thread."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        mean = self.batch_rows / self.batches if self.batches else 0.0
        return (
            f"consumed={self.consumed} scored={self.scored} late={self.scored_late} "
            f"routed_late={self.routed_late} dlq={self.dlq} batches={self.batches} "
            f"mean_batch_rows={mean:.1f} commits={self.commits} pauses={self.pauses}"
        )
