"""The produce leg on Apache Kafka (issue 26, item 2): with the input topic's
`message.timestamp.type=LogAppendTime`, a request's Kafka timestamp is the broker's
append, and with the producer's `tidebatch.produced_ms` header (stamped by `tidebatch
produce`, pipeline/commands/produce.py) a live worker observes
tidebatch_stage_seconds{stage="to_broker"} = append - produce() once per scored
request; a CreateTime topic gives none. Values are checked against the records
themselves, read back from the topic, never against a timing."""

from __future__ import annotations

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

from consumers.records import H_PRODUCED_MS
from pipeline.app.produce import produce
from pipeline.ops.stats import from_text
from tests.integration.opsutil import (
    Topics,
    http_get,
    live_worker,
    wait_for,
    wait_ready,
    worker_config,
)
from tests.integration.pipeline_helpers import read_topic

REQUESTS = 60


def _stage(samples: dict, suffix: str, stage: str) -> float:
    """A stage's _count or _sum over the scraped samples; 0 with no series."""
    series = samples.get(f"tidebatch_stage_seconds{suffix}", {})
    return sum(v for labels, v in series.items() if dict(labels).get("stage") == stage)


@pytest.mark.parametrize("timestamps", ["LogAppendTime", "CreateTime"])
def test_the_produce_leg_is_timed_only_on_a_log_append_time_topic(
    kafka_broker, kafka_topic_factory, unique_group_id, timestamps
):
    inp = kafka_topic_factory("leg-req", 1, config={"message.timestamp.type": timestamps})
    topics = Topics(inp, kafka_topic_factory("leg-res", 1), kafka_topic_factory("leg-dlq", 1),
                    kafka_topic_factory("leg-late", 1))
    # A generous SLO: every request is scored (none routed late), whatever the machine.
    cfg = worker_config(kafka_broker, topics, unique_group_id, batching={"slo_ms": 60000})
    with live_worker(cfg) as live:
        wait_ready(live.url)
        produce(kafka_broker.bootstrap_servers, "ctr", 200.0, REQUESTS, topic=inp, profile=kafka_broker.profile)
        wait_for(lambda: live.worker.stats.scored >= REQUESTS, 60, f"{REQUESTS} requests scored")
        status, _, text = http_get(live.url + "/metrics")
    assert status == 200
    samples = from_text(text)
    assert live.worker.stats.scored == REQUESTS
    assert _stage(samples, "_count", "to_worker") == REQUESTS

    sent = read_topic(kafka_broker.bootstrap_servers, inp, REQUESTS)
    assert len(sent) == REQUESTS
    assert all(dict(m.headers() or [])[H_PRODUCED_MS].isdigit() for m in sent)  # stamped by tidebatch produce
    if timestamps == "CreateTime":
        assert {m.timestamp()[0] for m in sent} == {TIMESTAMP_CREATE_TIME}
        assert _stage(samples, "_count", "to_broker") == 0
        return
    assert {m.timestamp()[0] for m in sent} == {TIMESTAMP_LOG_APPEND_TIME}
    assert _stage(samples, "_count", "to_broker") == REQUESTS
    # The same legs from the records: the broker's append minus the producer's stamp.
    legs = [max(m.timestamp()[1] - int(dict(m.headers())[H_PRODUCED_MS]), 0) / 1000.0 for m in sent]
    assert _stage(samples, "_sum", "to_broker") == pytest.approx(sum(legs), abs=1e-6)
