"""What a Worker is built from: built by the composition root (pipeline/app/compose.py),
read by the Worker (pipeline/worker/core.py), which builds only its own rooms from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from consumers.credential_refresh import CredentialRefresh
from consumers.records import Producer
from pipeline.batching.backpressure import Backpressure
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.policy_base import Policy
from pipeline.config import WorkerConfig
from pipeline.delivery.outcomes import Topics
from pipeline.observe.metrics import WorkerMetrics
from pipeline.observe.tracing import BatchTracer
from pipeline.registry.pipelines import PipelineSpec
from pipeline.sinks import ResultSink
from pipeline.versions.manager import ModelVersions
from pipeline.versions.slot import ModelSlot

if TYPE_CHECKING:
    from pipeline.redisio.attach import RedisParts


@dataclass
class WorkerParts:
    """What a Worker is built from. `redis` is closed by whoever built the parts,
    after the worker has stopped (its sinks flush into it at shutdown)."""

    cfg: WorkerConfig
    pipeline: PipelineSpec
    input_topic: str
    topics: Topics  # what the worker writes
    group_id: str
    metrics: WorkerMetrics
    policy: Policy
    queue: BatchQueue
    backpressure: Backpressure
    executors: int
    producer: Producer  # pipeline/kafka_backend.py picks the client
    sinks: list[ResultSink]
    slot: ModelSlot  # the serving version's model, session and step, swapped by `versions`
    versions: ModelVersions
    redis: RedisParts | None = None
    tracer: BatchTracer | None = None  # config `tracing` (pipeline/observe/tracing.py)
    # Follows a password rotated on the broker (consumers/credential_refresh.py); None
    # without a PLAIN/SCRAM login on the confluent client.
    credentials: CredentialRefresh | None = None

    def close(self) -> None:
        """Close what outlives the worker's own shutdown: Redis (its sinks flush into
        it at shutdown) and the tracer (buffered spans are exported)."""
        if self.redis is not None:
            self.redis.close()
        if self.tracer is not None:
            self.tracer.close()
