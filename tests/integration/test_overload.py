"""Under a backlog, requests that expired before they were consumed are routed late
without being decoded, so fresh requests behind them are still answered in time."""

from __future__ import annotations

import time

import orjson
from confluent_kafka import Producer

from consumers.profiles import producer_config
from pipeline.loadgen.ctr import CtrRequestFactory
from tests.integration.pipeline_helpers import read_topic, running_worker, wait_for, worker_config


def test_expired_records_are_routed_late_without_decoding(broker, topic_factory, unique_group_id) -> None:
    inp = topic_factory("ovl-req", partitions=1)
    out = topic_factory("ovl-scores", partitions=1)
    dlq = topic_factory("ovl-dlq", partitions=1)
    late = topic_factory("ovl-late", partitions=1)
    factory = CtrRequestFactory(seed=31)
    stale_ms = int(time.time() * 1000) - 60_000  # a minute old: past any budget configured here
    producer = Producer(producer_config(broker.profile, broker.bootstrap_servers))
    for i in range(50):
        key, value = factory.make(i)
        producer.produce(inp, key=key, value=value, timestamp=stale_ms)
    # Expired and malformed: never decoded, so it is routed late, not dead-lettered.
    producer.produce(inp, value=b"{not json", timestamp=stale_ms)
    assert producer.flush(30) == 0
    cfg = worker_config(
        broker.bootstrap_servers, inp, out, unique_group_id, dlq_topic=dlq, late_topic=late,
        batching={"policy": "adaptive", "expiry_action": "route_late", "slo_ms": 1000,
                  "priority_slo_ms": {1: 5000}},
    )
    with running_worker(cfg) as worker:
        fresh = [factory.make(100 + i) for i in range(20)]
        for key, value in fresh:
            producer.produce(inp, key=key, value=value)
        assert producer.flush(30) == 0
        routed = read_topic(broker.bootstrap_servers, late, 51)
        scored = read_topic(broker.bootstrap_servers, out, 20)
        wait_for(lambda: worker.tracker.pending() == 0, 30, "offsets pending")
        assert worker.stats.dlq == 0
        assert worker.stats.routed_late == 51
        assert worker.stats.consumed == 71
    assert len(routed) == 51
    assert {m.value() for m in routed} >= {b"{not json"}
    headers = dict(routed[0].headers())
    # Missed by the record's age minus the largest budget (5 s for priority 1), ~55 s.
    assert float(headers["tidebatch.deadline_missed_by_ms"]) > 50_000
    fresh_ids = {orjson.loads(v)["request_id"] for _, v in fresh}
    assert {orjson.loads(m.value())["request_id"] for m in scored} == fresh_ids
