"""Run one worker in this process until SIGTERM/SIGINT, with its ops endpoints
(/metrics, /healthz, /readyz, /api/stats and the dashboard; pipeline/ops/http.py)."""

from __future__ import annotations

import logging

from pipeline.config import WorkerConfig

log = logging.getLogger(__name__)


def serve(cfg: WorkerConfig) -> int:
    from pipeline.commands.run import prepare_topics
    from pipeline.redisio.attach import attach_redis
    from pipeline.sinks.build import build_sinks
    from pipeline.worker import Worker, install_signal_handlers

    if cfg.create_topics:
        prepare_topics(cfg)
    worker = Worker(cfg, sinks=build_sinks(cfg))  # offline sinks: `sinks` section, docs/ETL.md
    redis_parts = attach_redis(worker)  # `redis` section (docs/REDIS.md); None when all off
    install_signal_handlers(worker)
    server = None
    if cfg.metrics.enabled:
        from pipeline.ops.http import OpsServer

        # Up before run(): /healthz answers while the group is joined, and /readyz
        # says why the worker is not ready yet.
        server = OpsServer(worker, cfg.metrics.host, cfg.metrics.port).start()
        print(f"tidebatch worker metrics: {server.url}/metrics", flush=True)
        print(f"tidebatch worker dashboard: {server.url}/", flush=True)
    try:
        return worker.run()
    finally:
        if server is not None:
            server.stop()
        if redis_parts is not None:
            redis_parts.close()
