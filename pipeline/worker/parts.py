"""What a Worker is built from: built by the composition root (pipeline/app/compose.py),
read by the Worker (pipeline/worker/core.py), which only wires its rooms from them.

Every choice the configuration makes (policy, Kafka client, delivery mode, sinks, Redis,
tracer, tenants, limits) is made before a WorkerParts exists; what the rooms share
(the lifecycle, the offsets, the counters, the outage watch) is created with them, so
that each room gets it passed in instead of reaching back into the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consumers.credential_refresh import CredentialRefresh
from consumers.dead_letter import Origin
from consumers.offsets import OffsetTracker
from consumers.records import Producer, Source, TopicPartition
from pipeline.batching.backpressure import Backpressure
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.policy_base import Policy
from pipeline.config import WorkerConfig
from pipeline.delivery.kafka_progress import KafkaProgress
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.limits import Limits
from pipeline.delivery.outcomes import Topics
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.transactions import Transactions
from pipeline.delivery.watchdog import CallWatch
from pipeline.observe.metrics import WorkerMetrics
from pipeline.observe.tracing import BatchTracer
from pipeline.registry.pipelines import PipelineSpec
from pipeline.sinks import ResultSink
from pipeline.versions.manager import ModelVersions
from pipeline.versions.slot import ModelSlot
from pipeline.worker.admission import AdmissionRules

if TYPE_CHECKING:
    from pipeline.redisio.parts import RedisParts

Rebalanced = Callable[[list[TopicPartition]], None]
# Joins the consumer group: (on_assign, on_revoke, on_stats) -> the Kafka source, of the
# configured client (pipeline/kafka_backend.py make_source).
OpenSource = Callable[[Rebalanced, Rebalanced, Callable[[str], None]], Source]


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
    # What the rooms share (pipeline/delivery/): the source, the partitions owned, the
    # stop and the drain deadline; the offsets; the counters; whether Kafka takes writes
    # and commits; the blocking client call the source thread is in (read by /healthz
    # and the watchdog).
    lifecycle: Lifecycle
    tracker: OffsetTracker
    stats: WorkerStats
    progress: KafkaProgress
    calls: CallWatch
    transactions: Transactions | None  # delivery exactly_once (pipeline/delivery/transactions.py)
    limits: Limits  # the producer's own, until the broker has described the topics
    describe_limits: Callable[[], Limits]  # asks the broker (the run loop, before it joins)
    open_source: OpenSource
    admission: AdmissionRules
    origin: Origin  # the group, member and codec class that dead letters name
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
