"""Run one worker in this process until SIGTERM/SIGINT, with its metrics endpoint."""

from __future__ import annotations

import logging

from pipeline.config import WorkerConfig

log = logging.getLogger(__name__)


def serve(cfg: WorkerConfig) -> int:
    from pipeline.commands.run import prepare_topics
    from pipeline.worker import Worker, install_signal_handlers

    if cfg.create_topics:
        prepare_topics(cfg)
    worker = Worker(cfg)
    install_signal_handlers(worker)
    if cfg.metrics.enabled:
        from prometheus_client import start_http_server

        server, _thread = start_http_server(cfg.metrics.port, cfg.metrics.host, registry=worker.metrics.registry)
        port = server.server_address[1]
        log.info("metrics on http://%s:%d/metrics", cfg.metrics.host, port)
        print(f"tidebatch worker metrics: http://{cfg.metrics.host}:{port}/metrics", flush=True)
    return worker.run()
