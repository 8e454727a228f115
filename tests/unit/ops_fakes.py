"""What the tests of the ops arithmetic (tests/unit/test_ops_stats.py,
test_ops_health.py, test_ops_status.py, test_ops_tenants.py) build their figures
from: a worker's metrics with its SLO set, and a worker as the health rules see it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from pipeline.observe.metrics import WorkerMetrics


def worker_metrics(pipeline: str = "ctr") -> WorkerMetrics:
    m = WorkerMetrics(pipeline, "adaptive")
    m.slo.labels(pipeline).set(0.1)
    return m


def fake_worker(**kw) -> SimpleNamespace:
    started = threading.Event()
    if kw.pop("started", True):
        started.set()
    base = dict(started=started, assigned=[("t", 0)], last_poll_ok=100.0,
                session=SimpleNamespace(provider="cpu"), threads=lambda: [], stopping=False, failure=None)
    return SimpleNamespace(**{**base, **kw})
