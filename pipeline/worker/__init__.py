"""The tidebatch worker, in rooms (docs/ARCHITECTURE.md "Data flow in one worker"):

- compose.py: the composition root, configuration in, the parts of a Worker out;
- core.py: Worker, the run loop (source thread), backpressure, shutdown;
- admission.py: polled records -> requests (size limit, expiry, decode, deadlines);
- executors.py: executor threads scoring batches (pipeline/scoring.py);
- publisher.py: result documents, results and sink rows, in dispatch order;
- partitions.py: offset commits, lag, rebalance callbacks;
- transactions.py: delivery exactly_once, outcomes and offsets in one Kafka transaction;
- stats.py: the counters.
"""

from pipeline.app.compose import WorkerParts, batching_params, build_parts
from pipeline.worker.admission import InFlight
from pipeline.worker.core import Worker
from pipeline.worker.stats import WorkerStats

__all__ = [
    "InFlight", "Worker", "WorkerParts", "WorkerStats", "batching_params", "build_parts",
]
