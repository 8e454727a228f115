"""How `tidebatch profile` puts the measured stages together into one worker's
saturation throughput. Pure: the per-request figures come in.

The worker's threads (pipeline/worker/core.py, its module docstring):

- the source thread: consume, admission (decode, deadlines, offsets, queueing),
  delivery reports; all of it holds the GIL;
- the executor threads (`runtime.executors`, pipeline/app/compose.py
  `executor_count`): collate and split hold the GIL; ONNX Runtime releases it, or runs
  in the model process, which runs one batch at a time;
- the publisher thread: result documents and the produce calls; holds the GIL;
- librdkafka's own threads (fetching, sending) and, where the broker runs on this
  machine, the broker: CPU outside the GIL.

With a backlog every stage is busy at once, so a worker drains at the lowest of:

    GIL          1 / (source + publisher + collate/split)   one interpreter lock
    <thread>     1 / its own work                           a thread is on one core at a time
    model        executors / (executor's GIL work + model)  in-process: each executor runs one batch
                 1 / model                                  model process: one batch at a time
    cores        cores / every CPU second of a request      the machine's cores, shared by all

requests/s, times rows per request. The model's own time comes from the profile's
curve; the threads' figures from a calibration through a broker
(pipeline/profiling/calibration.py: each thread's CPU clock during a drain, contention
for the GIL included), else from the offline Python stage
(pipeline/profiling/stages.py), which has no Kafka work: then the figure is an upper
bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerStages:
    """CPU seconds per request of each part of a worker, and the layout it runs on."""

    source_s: float  # source thread (GIL): consume + admission + delivery reports
    publisher_s: float  # publisher thread (GIL): result documents + produce
    executor_python_s: float  # executor threads' GIL-held work: collate, split, queue, hand-over
    model_s: float  # the model's own time per request at the batch cap, GIL released
    rows_per_request: float
    executors: int  # executor threads (config runtime.executors; compose.executor_count)
    model_process: bool
    model_threads: int = 1  # ONNX Runtime intra-op threads: cores the model keeps busy while it runs
    other_s: float = 0.0  # the rest of the worker's process outside the GIL: librdkafka's threads
    broker_s: float = 0.0  # a broker on this machine
    cores: int = 1  # cores this worker may use (its CPU affinity)

    def bounds(self) -> dict[str, float]:
        """Requests/s each shared resource allows, by name."""
        gil = self.source_s + self.publisher_s + self.executor_python_s
        if self.model_process:
            model = _per(self.model_s)
        else:
            model = self.executors * _per(self.model_s + self.executor_python_s)
        cpu = gil + self.model_s * self.model_threads + self.other_s + self.broker_s
        return {
            "GIL": _per(gil),
            "source thread": _per(self.source_s),
            "publisher thread": _per(self.publisher_s),
            "model": model,
            "cores": self.cores * _per(cpu),
        }

    @property
    def limited_by(self) -> str:
        bounds = self.bounds()
        return min(bounds, key=lambda k: bounds[k])

    @property
    def capacity(self) -> float:
        """Rows/s of the worker with a backlog: the lowest bound."""
        return min(self.bounds().values()) * self.rows_per_request


def _per(seconds: float) -> float:
    return 1 / seconds if seconds > 0 else math.inf
