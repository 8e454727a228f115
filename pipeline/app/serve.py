"""Run one worker in this process until SIGTERM/SIGINT, with its ops endpoints
(/metrics, /healthz, /readyz, /api/stats and the dashboard; pipeline/ops/http.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.config import WorkerConfig

if TYPE_CHECKING:
    from pipeline.app.children import ChildSeat
    from pipeline.worker import Worker

log = logging.getLogger(__name__)


def serve(cfg: WorkerConfig, seat: ChildSeat | None = None, note: str | None = None) -> int:
    """`seat`: this worker is one process of `run --processes N` (pipeline/app/children.py):
    its ops port goes to the parent through the seat's file, its index into its metrics.
    `note`: a line logged once the checks passed (a failed check stays one line)."""
    from pipeline.app.compose import build_parts
    from pipeline.sinks.build import build_sinks
    from pipeline.worker import Worker

    preflight(cfg)
    if note:
        log.info("%s", note)
    # Offline sinks: the `sinks` section (docs/ETL.md); Redis: the `redis` section
    # (docs/REDIS.md), nothing connects when all of it is off.
    # A worker started by `tidebatch run --processes N` may be given its supervisor's
    # shared model host (pipeline/runtime/shared_host.py) instead of a model of its own.
    from pipeline.app.processes import MODEL_HOST_ENV

    host_address = os.environ.get(MODEL_HOST_ENV) or None
    parts = build_parts(cfg, sinks=build_sinks(cfg), redis=True, host_address=host_address)
    worker = Worker(cfg, parts=parts)
    from pipeline.delivery.watchdog import EXIT_MARGIN_S

    install_signal_handlers(worker, exit_after_s=cfg.drain_timeout_s + EXIT_MARGIN_S)
    server = None
    if cfg.metrics.enabled:
        from pipeline.ops.http import OpsServer

        # Up before run(): /healthz answers while the group is joined, and /readyz
        # says why the worker is not ready yet.
        server = OpsServer(worker, cfg.metrics.host, cfg.metrics.port).start()
        if seat is None:
            print(f"tidebatch worker metrics: {server.url}/metrics", flush=True)
            print(f"tidebatch worker dashboard: {server.url}/", flush=True)
        else:
            seat.report(server.port, parts.metrics.registry)
    try:
        return worker.run()
    finally:
        if server is not None:
            server.stop()
        parts.close()


def preflight(cfg: WorkerConfig) -> None:
    """What a worker, or the parent of `run --processes N`, checks and prepares before
    anything is built: the extras, the ops credentials, Kafka, the topics."""
    require_extras(cfg)
    if cfg.metrics.enabled:
        from pipeline.ops.http_auth import HttpAuth

        # A metrics.auth reference (${VAR}, @file:) that does not resolve is one line
        # now, not after the Kafka check and the model load.
        HttpAuth.from_config(cfg.metrics.auth)
    # Before anything else: a worker that cannot reach or get into Kafka exits 2 with
    # one line within kafka_connect_timeout_s, instead of retrying unready. A
    # kafka-python worker too, through librdkafka (a core dependency) with the same
    # credentials: kafka-python retries a refused login for ever and only logs it, and
    # the worker said "cannot read Kafka metadata ... Broker transport failure" after
    # 10.9 s (issue 44).
    from consumers.kafka_python_settings import librdkafka_check_settings
    from consumers.kafka_reachable import require_kafka

    settings = cfg.kafka.client("admin")
    if cfg.client == "kafka-python":
        settings = librdkafka_check_settings(settings)
    require_kafka(cfg.bootstrap_servers, cfg.kafka_connect_timeout_s, settings)
    log_kafka_settings(cfg)
    if cfg.create_topics:
        prepare_topics(cfg)


def require_extras(cfg: WorkerConfig) -> None:
    """The optional packages this config needs (pyproject.toml's extras), checked before
    anything connects or loads: a missing one is one line naming its extra
    (pipeline/extras.py), not an error after the Kafka check and the model load."""
    from pipeline.extras import load, onnxruntime
    from pipeline.kafka_backend import kafka_python_backend

    onnxruntime("the worker")
    if cfg.client == "kafka-python":
        kafka_python_backend()
    if cfg.tracing.enabled:
        load("opentelemetry.sdk.trace", "otel")


def log_kafka_settings(cfg: WorkerConfig) -> None:
    """The `kafka:` block as each client gets it, secrets shown as ***."""
    from consumers.client_settings import ROLES, redacted

    settings = {role: redacted(cfg.kafka.client(role)) for role in ROLES}
    if any(settings.values()):
        log.info("kafka client settings: %s", "; ".join(f"{r} {s}" for r, s in settings.items()))


def prepare_topics(cfg: WorkerConfig) -> None:
    """Create the worker's topics that are missing (cfg.create_topics): input, output,
    dead-letter and late, with cfg.partitions each."""
    from consumers.admin import ensure_topics, existing_topics
    from pipeline.delivery.outcomes import Topics
    from pipeline.registry.pipelines import pipeline_for

    spec = pipeline_for(cfg)
    inp = cfg.input_topic or spec.input_topic
    names = [inp, *Topics.for_input(inp, cfg.output_topic or spec.output_topic, cfg.dlq_topic, cfg.late_topic).all()]

    admin = cfg.kafka.client("admin")
    present = existing_topics(cfg.bootstrap_servers, admin_config=admin)
    missing = {n: cfg.partitions for n in names if n not in present}
    if missing:
        # Apache Kafka refuses values above the topic's max.message.bytes (~1 MB).
        limit = spec.max_message_bytes
        topic_config = {"max.message.bytes": str(limit + 65536)} if limit else None
        ensure_topics(cfg.bootstrap_servers, missing, topic_config=topic_config, admin_config=admin)
        log.info("created topics %s", ", ".join(sorted(missing)))


def install_signal_handlers(
    worker: Worker, on_signal: Callable[[], None] | None = None, exit_after_s: float | None = None
) -> None:
    """SIGTERM/SIGINT: stop consuming, finish in-flight batches, commit, exit 0.
    `exit_after_s`: with it, a watchdog thread (pipeline/delivery/watchdog.py) acts on the
    signal even while the main thread is inside a client call, and ends a process still
    running that long after its stop began with exit code 1."""
    import signal

    def handler(signum: int, _frame: object) -> None:
        worker.stop(f"signal {signal.Signals(signum).name}")
        if on_signal:
            on_signal()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if exit_after_s is not None:
        from pipeline.delivery.watchdog import Watchdog

        Watchdog(worker, exit_after_s).start()
