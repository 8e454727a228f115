"""The tidebatch worker, in rooms (docs/ARCHITECTURE.md "Data flow in one worker"):

- parts.py: what a Worker is built from (built by pipeline/app/compose.py, the
  composition root);
- core.py: Worker, the run loop (source thread), backpressure, shutdown;
- admission.py: polled records -> requests (size limit, expiry, decode, deadlines);
- executors.py: executor threads scoring batches (pipeline/scoring.py);
- publisher.py: result documents, results and sink rows, in dispatch order;
- late_routing.py, tenant_standing.py: where late results go, each tenant's standing.

What the worker shares with the generation service (offset commits, transactions,
outcomes, limits, the outage watch, the counters) is in pipeline/delivery/.
"""

from pipeline.worker.admission import InFlight
from pipeline.worker.core import Worker
from pipeline.worker.parts import WorkerParts

__all__ = ["InFlight", "Worker", "WorkerParts"]
