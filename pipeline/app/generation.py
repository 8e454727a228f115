"""`tidebatch generate` in one process: topics, the decoder, the scheduler, the Kafka
source and producer, and the generation loop (pipeline/generation/service.py) until
SIGTERM/SIGINT. The parts are built here and passed in, as pipeline/app/serve.py does for
the request-batching worker."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import KafkaOverrides
from pipeline.generation.service import PIPELINE, GenerateSettings, GenerationLoop

log = logging.getLogger(__name__)

INPUT_TOPIC = "generate.requests"
OUTPUT_TOPIC = "generate.results"
MAX_REQUEST_BYTES = 64 * 1024  # a prompt is at most the 256-token context; JSON room on top
DEAD_LETTER_PREFIX_BYTES = 64 * 1024


@dataclass(frozen=True)
class GenerateService:
    """Where and how: Kafka, topics, policy and KV budget (flags of `tidebatch generate`)."""

    bootstrap_servers: str = "127.0.0.1:9092"
    broker_profile: str = "kafka"
    group_id: str = "tidebatch-generate"
    input_topic: str = INPUT_TOPIC
    output_topic: str = OUTPUT_TOPIC
    dlq_topic: str | None = None
    policy: str = "continuous"
    max_slots: int = 16
    prefill_chunk: int | None = None
    provider: str = "cpu"
    intra_op_threads: int = 1
    create_topics: bool = True
    partitions: int = 1
    # The ops endpoints (pipeline/generation/ops.py); None: none. 9401, beside the
    # request worker's 9400 (pipeline/ops/http_config.py), so both run on one host.
    metrics_port: int | None = 9401
    metrics_host: str = "127.0.0.1"
    # librdkafka settings (-X: common to every client), secrets resolved per client as the
    # other commands' are (consumers/client_settings.py)
    kafka: KafkaOverrides = field(default_factory=KafkaOverrides)
    settings: GenerateSettings = field(default_factory=GenerateSettings)


def serve_generate(svc: GenerateService) -> int:
    from consumers.kafka_reachable import require_kafka
    from pipeline.app.serve import install_signal_handlers
    from pipeline.delivery.outcomes import Outcomes, Topics
    from pipeline.delivery.topic_limits import broker_limits
    from pipeline.extras import onnxruntime
    from pipeline.generation.budget import KvBudget
    from pipeline.generation.policies import make_generation_policy
    from pipeline.generation.runner import DecoderRunner, open_decoder
    from pipeline.generation.scheduler import GenerationScheduler
    from pipeline.generation.slot_decoder import open_in_place
    from pipeline.kafka_backend import confluent_producer, confluent_source
    from pipeline.observe.metrics import WorkerMetrics

    onnxruntime("the generate worker")
    admin = svc.kafka.client("admin")
    require_kafka(svc.bootstrap_servers, 30.0, admin)
    topics = Topics.for_input(svc.input_topic, svc.output_topic, svc.dlq_topic, None)
    if svc.create_topics:
        _prepare_topics(svc, topics, admin)
    session, shape = open_decoder(svc.provider, svc.intra_op_threads)
    # decoding steps in place on the KV slots (CPU GroupQueryAttention; None, with a warning: gathered)
    in_place = open_in_place(str(session.path), shape, svc.intra_op_threads, svc.provider)
    budget = KvBudget(svc.max_slots, svc.max_slots * shape.context)
    scheduler = GenerationScheduler(make_generation_policy(svc.policy), budget, prefill_chunk=svc.prefill_chunk)
    producer = confluent_producer(svc.broker_profile, svc.bootstrap_servers, svc.kafka.client("producer"))
    metrics = WorkerMetrics(PIPELINE, svc.policy)
    limits = broker_limits(svc.bootstrap_servers, admin, MAX_REQUEST_BYTES, DEAD_LETTER_PREFIX_BYTES,
                           producer, topics)

    def outcomes_for(ack, fail) -> Outcomes:  # noqa: ANN001 (the loop's own callbacks)
        return Outcomes(producer, ack, topics, limits, metrics=metrics, pipeline=PIPELINE, fail=fail,
                        count=lambda name, n: loop.stats.count(name, n))

    loop = GenerationLoop(producer=producer, outcomes_for=outcomes_for, scheduler=scheduler,
                          runner=DecoderRunner(session, shape, svc.max_slots, in_place), settings=svc.settings,
                          metrics=metrics, context=shape.context)
    install_signal_handlers(loop)  # type: ignore[arg-type]  # it only calls stop(reason)
    source = confluent_source(svc.broker_profile, svc.bootstrap_servers, svc.kafka.client("consumer"), svc.group_id,
                              [svc.input_topic], loop.partitions.on_assign, loop.on_revoke)
    log.info("generate worker: %s -> %s, policy %s, %d KV slots of %d tokens", svc.input_topic,
             svc.output_topic, svc.policy, svc.max_slots, shape.context)
    print(f"tidebatch generate: {svc.input_topic} -> {svc.output_topic} (policy {svc.policy})", flush=True)
    server = None
    if svc.metrics_port is not None:
        from models.registry import load_spec
        from pipeline.generation.ops import GenerateOpsView
        from pipeline.ops.http import OpsServer

        view = GenerateOpsView(loop, policy=svc.policy, group_id=svc.group_id, input_topic=svc.input_topic,
                               provider=getattr(session, "provider", svc.provider), model=load_spec("decoder"))
        server = OpsServer(view, svc.metrics_host, svc.metrics_port).start()
        print(f"tidebatch generate metrics: {server.url}/metrics", flush=True)
    try:
        return loop.run(source)
    finally:
        if server is not None:
            server.stop()


def _prepare_topics(svc: GenerateService, topics: Any, admin: dict[str, Any]) -> None:
    from consumers.admin import ensure_topics, existing_topics

    present = existing_topics(svc.bootstrap_servers, admin_config=admin)
    names = [svc.input_topic, topics.output, topics.dead_letter]
    missing = {n: svc.partitions for n in names if n not in present}
    if missing:
        ensure_topics(svc.bootstrap_servers, missing, admin_config=admin)
        log.info("created topics %s", ", ".join(sorted(missing)))
