"""Backpressure on the real broker: a backlog many times the queue's high watermark
drains with intake held, never with the partitions paused. pause() would purge
librdkafka's prefetched records and it refetches only ~0.8 s after resume(), which
cut a backlog drain to about a quarter (pipeline/batching/backpressure.py)."""

from __future__ import annotations

from consumers.confluent_backend import ConfluentSource
from tests.integration.opsutil import live_worker, make_topics, produce_ctr, wait_for, worker_config

N = 3000


def test_backlog_drains_holding_intake_without_pausing_partitions(
    broker, topic_factory, unique_group_id, monkeypatch
):
    topics = make_topics(topic_factory, 2)
    produce_ctr(broker.bootstrap_servers, topics.input, N, seed=31)
    pauses: list[int] = []
    original = ConfluentSource.pause_all

    def counting_pause_all(self: ConfluentSource) -> None:
        pauses.append(1)
        original(self)

    monkeypatch.setattr(ConfluentSource, "pause_all", counting_pause_all)
    # ~50 requests fill the queue: the drain runs into the high watermark many times.
    cfg = worker_config(
        broker, topics, unique_group_id, max_items=200,
        batching={"policy": "static", "queue_high_rows": 1000, "queue_low_rows": 500, "slo_ms": 600_000},
    )
    with live_worker(cfg) as live:
        wait_for(lambda: live.worker.stats.scored == N, 120, f"all {N} requests scored")
        assert live.worker.stats.pauses >= 2, "the backlog never reached the high watermark"
    assert not pauses, "backpressure paused the partitions while the model was draining"
