"""The composition root: configuration in, the parts a Worker is built from out.

    parts = build_parts(cfg, sinks=build_sinks(cfg), redis=True)
    worker = Worker(cfg, parts=parts)       # or build_worker(cfg) without Redis
    ...
    worker.run(); parts.close()

Every choice the configuration makes is made here, in one order: the pipeline and its
topics, the model's session, the Redis parts (their hooks, sinks and codec) *before*
the warm-up profile that runs the codec, the batch queue with its policy and tenant
gate, the Kafka producer and the client the source will be, the size limits,
admission's budgets, and what the rooms share (the lifecycle, the offsets, the
counters, the outage watch, the transactions of delivery exactly_once). The Worker
only wires its rooms (pipeline/worker/) from these.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from consumers.dead_letter import Origin, class_path, member_id
from consumers.offsets import OffsetTracker
from pipeline.batching.backpressure import Backpressure
from pipeline.batching.batcher import Batcher
from pipeline.batching.concurrent import BatchQueue
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.depth import PipelineDepth
from pipeline.batching.policy_base import Policy
from pipeline.batching.registry import make_policy, policy_params
from pipeline.clock import Clock, MonotonicClock
from pipeline.codecs.base import Codec
from pipeline.config import RuntimeConfig, WorkerConfig
from pipeline.config.tenants import (
    class_slo_seconds,
    max_budget_ms,
    priority_budget_ms,
    tenant_budget_ms,
    tenant_gate,
)
from pipeline.delivery.kafka_progress import KafkaProgress
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.outcomes import Topics
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.topic_limits import described_limits, worker_limits
from pipeline.delivery.transactions import Transactions
from pipeline.delivery.watchdog import CallWatch
from pipeline.hooks import WorkerHook
from pipeline.kafka_backend import credential_refresh, make_producer, make_source
from pipeline.observe.metrics import LATENCY_BUCKETS, WorkerMetrics
from pipeline.observe.tenant_metrics import watch_tenants
from pipeline.observe.tracing import make_tracer
from pipeline.registry.pipelines import PipelineSpec, pipeline_for
from pipeline.registry.schema_settings import register_results
from pipeline.runtime.device import batch_sizes_for
from pipeline.runtime.sessions import open_session
from pipeline.scoring import ScoringStep
from pipeline.sinks import ResultSink
from pipeline.versions.loader import VersionLoader
from pipeline.versions.manager import ModelVersions
from pipeline.versions.slot import ModelSlot
from pipeline.worker.admission import AdmissionRules
from pipeline.worker.core import Worker
from pipeline.worker.parts import WorkerParts
from pipeline.worker.tenant_standing import gate_standing

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pipeline.redisio.config import RedisConfig
    from pipeline.redisio.parts import RedisParts

log = logging.getLogger(__name__)

POLL_RECORDS = 1000  # records per poll at most; the backpressure's intake step


def executor_count(runtime: RuntimeConfig) -> int:
    """Executor threads (batches in flight) for the `runtime` section: 4 with a model
    process, else 1 (docs/ARCHITECTURE.md, "Batches in flight"); also read by
    `tidebatch profile` (pipeline/profiling/capacity.py)."""
    return runtime.executors or (4 if runtime.model_process else 1)


def group_id_of(cfg: WorkerConfig) -> str:
    """The consumer group a worker of `cfg` joins: `group_id`, else tidebatch-<pipeline>."""
    return cfg.group_id or f"tidebatch-{cfg.pipeline}"


def batching_params(cfg: WorkerConfig, pipeline_max_rows: int) -> dict[str, Any]:
    """make_policy's parameters from the `batching` section; the row cap defaults to
    the pipeline's own."""
    b = cfg.batching
    return policy_params(
        b.policy,
        max_batch_rows=b.max_batch_rows or pipeline_max_rows,
        max_queue_delay_ms=b.max_queue_delay_ms,
        hold_for_efficiency=b.hold_for_efficiency,
    )


def build_parts(
    cfg: WorkerConfig,
    *,
    clock: Clock | None = None,
    sinks: list[ResultSink] | None = None,
    hooks: list[WorkerHook] | None = None,
    redis: bool = False,
    host_address: str | None = None,
) -> WorkerParts:
    """Build every part of a worker for `cfg`. redis: also the `redis` section's hooks,
    sinks and codec (docs/REDIS.md; nothing connects when every Redis feature is off).
    host_address: the shared model host to connect to (pipeline/runtime/shared_host.py),
    for this session and every later version's; the worker then runs as with
    runtime.model_process (batches in flight, their executors), as it is one.
    The model session (a model process, maybe) is closed again if a later step fails."""
    if host_address is not None and not cfg.runtime.model_process:
        cfg = replace(cfg, runtime=replace(cfg.runtime, model_process=True))
    pipeline = pipeline_for(cfg)
    input_topic = cfg.input_topic or pipeline.input_topic
    topics = Topics.for_input(input_topic, cfg.output_topic or pipeline.output_topic, cfg.dlq_topic, cfg.late_topic)
    model = pipeline.load_model()
    params = batching_params(cfg, pipeline.max_batch_rows)
    policy = make_policy(cfg.batching.policy, **params)
    metrics = WorkerMetrics(cfg.pipeline, cfg.batching.policy)
    rt = cfg.runtime
    # what IO binding and CUDA graphs pad batches to (docs/MODELS.md, "On a GPU host")
    sizes = batch_sizes_for(cfg.batching.allowed_batch_sizes, cfg.batching.max_batch_rows or pipeline.max_batch_rows)
    session = open_session(model.onnx_path, rt, metrics.model_restarts.labels(cfg.pipeline).inc, sizes, host_address)
    redis_parts: RedisParts | None = None
    try:
        metrics.provider.info({"model": model.name, "version": model.version, "provider": session.provider})
        codec = pipeline.make_codec(cfg)
        register_results(codec)  # a schema-registry codec's result schema, before the first result
        hooks = list(hooks or [])
        sinks = list(sinks or [])
        if redis:
            redis_parts = build_redis(cfg.redis, metrics.registry, exactly_once=cfg.delivery == "exactly_once")
            if redis_parts is not None:
                if cfg.redis.features.enabled:
                    codec = accept_id_requests(codec, cfg.pipeline)
                hooks += redis_parts.hooks
                sinks += redis_parts.sinks
        step = ScoringStep(model, codec, session, hooks)
        cost = CostModel(prior=step.warm_up(pipeline)) if rt.warmup else CostModel()
        executors = executor_count(rt)
        queue = batch_queue(cfg, policy, cost, clock or MonotonicClock(), executors,
                             params.get("max_batch_rows", pipeline.max_batch_rows))
        metrics.tenants = watch_tenants(metrics.registry, cfg.pipeline, queue.batcher.tenants, queue.clock.now,
                                        LATENCY_BUCKETS, class_slo_seconds(cfg.tenants, cfg.batching))
        b = cfg.batching
        backpressure = Backpressure(b.queue_high_rows, b.queue_low_rows, poll_records=POLL_RECORDS)
        group_id = group_id_of(cfg)
        credentials = credential_refresh(cfg)
        producer = make_producer(cfg, group_id, credentials)
        slot = ModelSlot(step)
        loader = VersionLoader(cfg, pipeline, codec, hooks, metrics, session.input_names, sizes, host_address)
        versions = _versions(cfg, pipeline, slot, loader, queue, metrics)
        # What the rooms share, and the delivery mode's transactions, which share it too.
        lifecycle, tracker, stats = Lifecycle(), OffsetTracker(), WorkerStats()
        progress, calls = KafkaProgress(time.monotonic(), cfg.outage_after_s), CallWatch()
        transactions = None if cfg.delivery != "exactly_once" else Transactions(  # make_producer made it transactional
            producer, lifecycle, tracker, sinks, cfg.transaction_interval_ms / 1000.0,  # type: ignore[arg-type]
            metrics, cfg.pipeline, stats, lifecycle.fail, progress=progress, calls=calls,
        )
        return WorkerParts(
            cfg, pipeline, input_topic, topics, group_id, metrics, policy, queue, backpressure, executors, producer,
            sinks, slot, versions, lifecycle, tracker, stats, progress, calls, transactions,
            limits=worker_limits(cfg, pipeline, producer, topics, {}),  # the producer's own, until run() asks
            describe_limits=partial(described_limits, cfg, pipeline, producer, topics),
            open_source=partial(make_source, cfg, group_id, [input_topic], credentials=credentials),
            admission=admission_rules(cfg, policy, queue, metrics),
            origin=Origin(group_id, member_id(cfg.instance_id()), class_path(codec)),
            redis=redis_parts, tracer=make_tracer(cfg.tracing, cfg.pipeline), credentials=credentials,
        )
    except BaseException:
        # Nobody will run or shut down a worker from these parts: a model process must
        # not outlive them, nor a Redis link.
        session.close()
        if redis_parts is not None:
            redis_parts.close()
        raise


def admission_rules(cfg: WorkerConfig, policy: Policy, queue: BatchQueue, metrics: WorkerMetrics) -> AdmissionRules:
    """Admission's budgets and shedding (pipeline/worker/admission.py) for `cfg`."""
    b = cfg.batching
    # Route records before decoding them: only where the configured outcome of expiry is
    # "routed late" anyway; tenant classes over their share first.
    routes = policy.separates_late and b.expiry_action == "route_late"
    return AdmissionRules(
        priority_budget_ms(b), max_budget_ms(cfg.tenants, b) if routes else None,
        tenant_budget_ms(cfg.tenants, b, queue.batcher.tenants), reserve=b.shed_reserve,
        tenants=gate_standing(queue, metrics.tenants),
        wait_ms=max_budget_ms(cfg.tenants, b),  # a decode waiting for its schema (worker/waiting.py)
    )


def build_redis(rc: RedisConfig, registry: CollectorRegistry, *, exactly_once: bool = False) -> RedisParts | None:
    """The `redis` section's hooks and sinks over one link (docs/REDIS.md); None when no
    Redis feature is enabled (then nothing connects). exactly_once: the worker's
    delivery mode, which changes what a redelivery means to dedup
    (pipeline/redisio/dedup.py)."""
    if not rc.used:
        return None
    from pipeline.redisio.dedup import DedupHook
    from pipeline.redisio.features import FeatureLookupHook
    from pipeline.redisio.link import RedisLink
    from pipeline.redisio.metrics import register_redis_metrics
    from pipeline.redisio.parts import RedisParts
    from pipeline.redisio.scores import ScoreStoreSink

    metrics = register_redis_metrics(registry)
    link = RedisLink(rc, metrics).start()
    parts = RedisParts(link, metrics)
    if rc.features.enabled:
        parts.hooks.append(FeatureLookupHook(link, metrics, rc.key_prefix, rc.features.lookup))
    if rc.dedup.enabled:
        parts.hooks.append(
            DedupHook(link, metrics, key_prefix=rc.key_prefix, ttl_s=rc.dedup.ttl_s,
                      action=rc.dedup.action, exactly_once=exactly_once)
        )
    if rc.store.enabled:
        parts.sinks.append(
            ScoreStoreSink(
                link, metrics, key_prefix=rc.key_prefix, ttl_s=rc.ttl_s,
                buffer_max=rc.store.buffer_max, flush_timeout_s=rc.store.flush_timeout_s,
            )
        )
    on = {True: "on", False: "off"}
    log.info(
        "redis at %s: features %s, score store %s, dedup %s",
        link.url, on[rc.features.enabled], on[rc.store.enabled],
        f"on ({rc.dedup.action})" if rc.dedup.enabled else "off",
    )
    return parts


def accept_id_requests(codec: Codec, pipeline: str) -> Codec:
    """The codec a worker with feature lookup decodes with: one that takes id-only
    requests too (pipeline/redisio/codec.py), or the codec unchanged, with a warning,
    where there is none (feature lookup is CTR only)."""
    from pipeline.redisio.codec import id_request_codec

    with_ids = id_request_codec(codec)
    if with_ids is None:
        log.warning("redis.features.enabled has no effect on pipeline %r (CTR only)", pipeline)
        return codec
    return with_ids


def _versions(
    cfg: WorkerConfig, pipeline: PipelineSpec, slot: ModelSlot, load: VersionLoader, queue: BatchQueue, metrics: WorkerMetrics
) -> ModelVersions:
    """The model's later versions (pipeline/versions/): each swapped-in one restarts the
    cost model from its own warm-up and is what the `tidebatch_model` info names."""
    model = slot.current.model
    loads = metrics.model_loads
    for outcome in ("loaded", "refused"):  # from 0, so that the first refusal is an increase() alerts see
        loads.labels(cfg.pipeline, outcome)

    def on_swap(step: ScoringStep, cost: AffineCost) -> None:
        loads.labels(cfg.pipeline, "loaded").inc()
        metrics.provider.info({"model": step.model.name, "version": step.model.version, "provider": step.session.provider})
        if cfg.runtime.warmup:
            queue.restart_cost(cost)

    return ModelVersions(
        cfg.pipeline, slot, model.source or model.onnx_path, model.version, load, cfg.runtime.model_poll_s,
        on_swap, lambda _version: loads.labels(cfg.pipeline, "refused").inc(),
    )


def batch_queue(
    cfg: WorkerConfig, policy: Policy, cost: CostModel, clock: Clock, executors: int, max_rows: int
) -> BatchQueue:
    """The worker's batch queue for `cfg` (also built by `tidebatch profile` to time the
    source thread's queueing, pipeline/profiling/stages.py)."""
    b = cfg.batching
    batcher = Batcher(
        policy,
        cost,
        expiry_action=b.expiry_action,  # type: ignore[arg-type]
        late_share=b.late_share,
        max_late_rows=b.max_late_rows,
        allowed_batch_sizes=b.allowed_batch_sizes or None,
        tenants=tenant_gate(cfg.tenants, b),  # None without a `tenants:` section
    )
    depth = None
    if cfg.runtime.model_process and executors > 1:
        # Several batches in flight only while a backlog needs the model's full rate
        # (batching/depth.py): from the backpressure's low watermark (and at least a
        # full batch for every executor) queued, back to one at a time at one full
        # batch. A lower mark flipped JSON requests at 50 % load into backlog mode on
        # every bursty poll, and their latency rose by half.
        enter = min(max(executors * max_rows, b.queue_low_rows), b.queue_high_rows)
        depth = PipelineDepth(executors, enter, min(max_rows, enter - 1))
    return BatchQueue(batcher, clock, b.queue_high_rows, b.queue_low_rows, depth=depth)


def build_worker(
    cfg: WorkerConfig,
    *,
    clock: Clock | None = None,
    sinks: list[ResultSink] | None = None,
    hooks: list[WorkerHook] | None = None,
) -> Worker:
    """A Worker with its parts built here from cfg, clock, sinks and hooks (no Redis):
    what the tests and the profiler's calibration run."""
    return Worker(cfg, parts=build_parts(cfg, clock=clock, sinks=sinks, hooks=hooks))
