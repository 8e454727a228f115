"""The answer tail: how long after the model has finished a batch its requests'
results are handed to the producer, learned from the batches just published.

Why (issue 26, docs/BATCHING.md "The answer tail"): a request is answered when its
result is handed to the producer (the result record's timestamp), not when the model
returns. Between the two the worker splits the batch, builds a result document per
request and hands each to librdkafka, on a publisher thread that shares the GIL with
the source thread. The batcher's deadline arithmetic (pipeline/batching/policies.py
`fits`, `hopeless`) counted only the model's time: at 120 % of the live capacity on
Apache Kafka adaptive scored 5610 requests late for 6664 in time, every one of them
having cost a decode, a model row and a result document that nobody could use. So the
worker gives the batcher each request's deadline less this tail: the time by which its
batch must have left the model (pipeline/worker/admission.py).

Pure: the times come in as arguments.
"""

from __future__ import annotations

import math
from collections import deque

# Batches the tail is learned from: at the CTR pipeline's ~100 batches/s under load a
# few tenths of a second, so it follows the load as it changes.
DEFAULT_WINDOW = 32
# Its quantile over those batches, each measured to its *last* result: nearly every
# request is answered within it, without one stalled batch (a GC pause, a first
# connection) setting the figure for the next thirty.
DEFAULT_QUANTILE = 0.9
# The most of a request's budget the tail may take: a publisher stalled for longer
# would otherwise make every request look hopeless and route them all.
MAX_SHARE = 0.5


class AnswerTail:
    """Ms from a batch's model end to its last result handed to the producer: the
    `quantile` of the last `window` batches; 0 until a batch was answered."""

    def __init__(self, window: int = DEFAULT_WINDOW, quantile: float = DEFAULT_QUANTILE) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        if not 0.0 < quantile <= 1.0:
            raise ValueError("quantile must be in (0, 1]")
        self.quantile = quantile
        self._recent: deque[float] = deque(maxlen=window)
        self._ms = 0.0

    def observe(self, ms: float) -> None:
        self._recent.append(max(ms, 0.0))
        ordered = sorted(self._recent)
        self._ms = ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)]

    @property
    def ms(self) -> float:
        return self._ms

    def for_budget(self, budget_ms: float) -> float:
        """The tail to take off a deadline of this budget (at most MAX_SHARE of it)."""
        return min(self._ms, budget_ms * MAX_SHARE)
