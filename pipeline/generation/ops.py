"""The generate worker as the ops server reads a worker (pipeline/ops/http.py,
pipeline/ops/health.py): /metrics, /healthz, /readyz, /api/stats and the dashboard for
`tidebatch generate`, the same endpoints and probes as `tidebatch run`'s.

Why a view and not the loop itself: the ops server reads a worker through the
attributes pipeline/worker/core.py documents (`cfg.batching.slo_ms`, `started`,
`assigned`, `last_poll_ok`, `threads()`, ...), and the generation loop
(pipeline/generation/service.py) has no WorkerConfig. This names what each of those
means for a generation loop, in one place, and reads the loop live (the server's
threads only read).

What the figures mean here: the SLO gauge (`tidebatch_slo_seconds`) is the admission
deadline of a request without its own `deadline_ms`; `tidebatch_queue_rows` is the
requests waiting for a KV slot; readiness needs partitions, the decoder and a broker
poll within the last few seconds, as the request worker's does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.ops.http_config import MetricsConfig

if TYPE_CHECKING:
    from consumers.records import TopicPartition
    from pipeline.delivery.stats import WorkerStats
    from pipeline.generation.service import GenerationLoop
    from pipeline.observe.metrics import WorkerMetrics


@dataclass(frozen=True)
class _Batching:
    policy: str
    slo_ms: float


@dataclass(frozen=True)
class OpsConfig:
    """The parts of a worker config the ops server reads."""

    pipeline: str
    group_id: str
    input_topic: str
    batching: _Batching
    metrics: MetricsConfig = field(default_factory=MetricsConfig)


@dataclass(frozen=True)
class _Session:
    provider: str  # readiness's "model loaded": the decoder's session is open


class _Waiting:
    def __init__(self, loop: GenerationLoop) -> None:
        self._loop = loop

    @property
    def rows(self) -> int:
        return self._loop.scheduler.waiting


class GenerateOpsView:
    """One generation loop, read as pipeline/ops/http.py reads a Worker."""

    def __init__(self, loop: GenerationLoop, *, policy: str, group_id: str, input_topic: str, provider: str,
                 metrics_config: MetricsConfig | None = None, model: Any = None) -> None:
        """model: what GET /model shows (name, version, onnx_path: the decoder's
        models/registry.py ModelSpec); the decoder has no versions to reload."""
        self._loop = loop
        self.model = model
        self.cfg = OpsConfig(loop.metrics.pipeline, group_id, input_topic,
                             _Batching(policy, loop.settings.deadline_ms), metrics_config or MetricsConfig())
        self.session = _Session(provider)
        self.queue = _Waiting(loop)

    @property
    def metrics(self) -> WorkerMetrics:
        return self._loop.metrics

    @property
    def started(self) -> threading.Event:
        return self._loop.started

    @property
    def assigned(self) -> list[TopicPartition]:
        return list(self._loop.lifecycle.assigned)

    @property
    def last_poll_ok(self) -> float | None:
        return self._loop.last_poll_ok

    @property
    def stopping(self) -> bool:
        return self._loop.stopping

    @property
    def failure(self) -> str | None:
        return self._loop.failure

    @property
    def stats(self) -> WorkerStats:
        return self._loop.stats

    def threads(self) -> list[threading.Thread]:
        # One thread: the loop polls, steps the decoder and sends; a stalled or dead
        # loop shows in last_poll_ok and the source thread liveness is given.
        return []
