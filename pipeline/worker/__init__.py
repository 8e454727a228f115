"""The tidebatch worker, in rooms (docs/ARCHITECTURE.md "Data flow in one worker"):

- core.py: Worker, the run loop (source thread), shutdown, rebalances, commits;
- admission.py: polled records -> requests (size limit, expiry, decode, deadlines);
- executors.py: executor threads scoring batches (pipeline/scoring.py);
- publisher.py: result documents, results and sink rows, in dispatch order;
- stats.py: the counters.
"""

from pipeline.worker.admission import InFlight
from pipeline.worker.core import Worker, batching_params, install_signal_handlers
from pipeline.worker.stats import WorkerStats

__all__ = ["InFlight", "Worker", "WorkerStats", "batching_params", "install_signal_handlers"]
