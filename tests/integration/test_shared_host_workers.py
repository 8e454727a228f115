"""Workers built with a shared model host's address (pipeline/app/compose.py
build_parts(host_address=...), what serve.py does with TIDEBATCH_MODEL_HOST): two
workers of one group on one host score every request, through the host's death."""

from __future__ import annotations

import os
import signal
import threading

from pipeline.app.compose import build_parts
from pipeline.runtime.model_process import ProcessSession
from pipeline.runtime.shared_host import SharedModelHost
from pipeline.worker import Worker
from tests.integration.opsutil import make_topics, produce_ctr, wait_for, worker_config


def test_two_workers_share_one_host_and_score_every_request(broker, topic_factory, unique_group_id, tmp_path):
    topics = make_topics(topic_factory, 2)
    cfg = worker_config(broker, topics, unique_group_id, batching={"policy": "static", "slo_ms": 600_000})
    assert not cfg.runtime.model_process
    with SharedModelHost(str(tmp_path / "host.sock"), "cpu", 1).start() as host:
        workers, threads = [], []
        try:
            for _ in range(2):
                parts = build_parts(cfg, host_address=host.address)
                worker = Worker(parts.cfg, parts=parts)
                workers.append(worker)
                threads.append(threading.Thread(target=worker.run, daemon=True))
            for t in threads:
                t.start()
            assert all(isinstance(w.session, ProcessSession) and w.session.pid == host.pid for w in workers)
            assert workers[0].cfg.runtime.model_process  # batches in flight, as with a model process
            (model,) = host.stats()["models"].values()
            assert model["users"] == 2
            produce_ctr(broker.bootstrap_servers, topics.input, 3000, seed=43)
            wait_for(lambda: sum(w.stats.scored for w in workers) >= 300, 120, "300 requests scored")
            os.kill(host.pid, signal.SIGKILL)  # mid-stream; the supervisor starts it again
            wait_for(lambda: not host.alive(), 30, "the host to die")
            host.restart()
            wait_for(lambda: sum(w.stats.scored for w in workers) >= 3000, 180, "all 3000 requests scored")
            assert sum(w.stats.dlq for w in workers) == 0
        finally:
            for w in workers:
                w.stop("test done")
            for t in threads:
                t.join(60)
    assert sum(w.stats.scored for w in workers) == 3000
