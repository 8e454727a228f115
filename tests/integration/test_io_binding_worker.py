"""A worker whose model runs through IO binding (runtime.io_binding: true, on CPU here;
pipeline/runtime/io_binding.py): every request scored, none dead-lettered, in process
and in a model process (which gets the device keys as one JSON argument)."""

from __future__ import annotations

import pytest

from tests.integration.opsutil import live_worker, make_topics, produce_ctr, wait_for, worker_config


@pytest.mark.parametrize("model_process", [False, True], ids=["in-process", "model-process"])
def test_a_worker_through_io_binding_scores_every_request(broker, topic_factory, unique_group_id,
                                                          model_process: bool) -> None:
    topics = make_topics(topic_factory, 2)
    cfg = worker_config(
        broker, topics, unique_group_id,
        batching={"policy": "adaptive", "slo_ms": 600_000},
        runtime={"io_binding": True, "model_process": model_process},
    )
    with live_worker(cfg) as live:
        worker = live.worker
        if not model_process:  # the batch sizes of the CTR pipeline's cap (512): powers of two
            assert worker.session._bound.sizes == tuple(2**i for i in range(10))
        produce_ctr(broker.bootstrap_servers, topics.input, 600, seed=5)
        wait_for(lambda: worker.stats.scored >= 600, 120, "600 requests scored")
        assert worker.stats.dlq == 0
    assert worker.stats.scored == 600
