"""Issue 48: the schema registry stopped for 10 s while Avro requests flow to a running
CTR worker (Apicurio with file storage, conftest.py `schema_registry_server`; Apache
Kafka). Nothing is lost, every request gets exactly one outcome:
- requests of the schema id the worker knows go on being scored during the outage;
- requests of a schema id it has never seen, sent during the outage, wait for their
  fetch within their deadline, then are dead-lettered with the reason;
- once the registry is back, that id is fetched and its requests are scored."""

from __future__ import annotations

import threading
import time

import orjson

from consumers.dead_letter import H_ERROR
from pipeline.codecs.ctr import ctr_request_type
from pipeline.codecs.record_types import STRING, Field, Record
from pipeline.codecs.schema_records import RecordWriter
from pipeline.loadgen.ctr import CtrRequestFactory
from tests.integration.pipeline_helpers import (
    produce_values,
    read_topic,
    running_worker,
    wait_for,
    worker_config,
)
from tests.integration.schema_helpers import stock_reader

OUTAGE_S = 10.0
SLO_MS = 2000.0  # the wait of a request whose schema cannot be fetched


def test_a_registry_outage_loses_nothing(kafka_broker, kafka_topic_factory, schema_registry_server, unique_group_id):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    b, registry = kafka_broker.bootstrap_servers, schema_registry_server
    inp, out = kafka_topic_factory("outage-in", partitions=2), kafka_topic_factory("outage-out", partitions=2)
    dlq = kafka_topic_factory(f"{inp}.dlq", exact=True)
    cfg = worker_config(b, inp, out, unique_group_id, dlq_topic=dlq, batching={"slo_ms": SLO_MS},
                        schema_registry={"url": registry.url, "format": "avro"})
    producer_client = SchemaRegistryClient({"url": registry.url})  # caches what it registered: sends in the outage
    v1 = ctr_request_type("CtrRequest")
    known = RecordWriter("avro", v1, producer_client, inp)
    unseen = RecordWriter("avro", Record(v1.name, (*v1.fields, Field("campaign", STRING, optional=True))),
                          producer_client, inp)
    factory = CtrRequestFactory(seed=8)
    sent: dict[str, str] = {}  # request_id -> "known", "unseen-down", "unseen-up"

    def send(kind: str, writer: RecordWriter, count: int) -> None:
        items = []
        for _ in range(count):
            doc = orjson.loads(factory.make(len(sent))[1])
            doc["request_id"] = f"{kind}-{len(sent)}"
            sent[doc["request_id"]] = kind
            items.append((None, writer(doc)))
        produce_values(b, inp, items)

    send("known", known, 1)
    unseen(orjson.loads(factory.make(10_000)[1]))  # registered now, never sent before the outage
    stop_flow = threading.Event()

    def flow() -> None:
        while not stop_flow.is_set():
            send("known", known, 4)
            time.sleep(0.1)

    with running_worker(cfg) as worker:
        assert len(read_topic(b, out, 1, timeout=60)) == 1  # the worker knows the v1 id now
        flowing = threading.Thread(target=flow, daemon=True)
        flowing.start()
        try:
            registry.stop()
            time.sleep(1.0)
            send("unseen-down", unseen, 5)
            time.sleep(OUTAGE_S - 1.0)
            # Known ids were scored while the registry was down (the result records are
            # counted, not read: a reader of their schema would need the registry).
            wait_for(lambda: len(read_topic(b, out, 100, timeout=1)) >= 100, 60,
                     "requests of the known schema id were not scored while the registry was down")
        finally:
            registry.start()
        send("unseen-up", unseen, 5)
        time.sleep(1.0)
        stop_flow.set()
        flowing.join(10)
        results = read_topic(b, out, len(sent) - 5, timeout=120)
        dead = read_topic(b, dlq, 5, timeout=60)
        wait_for(lambda: worker.tracker.pending() == 0, 30, "a request without its outcome")
    read = stock_reader("avro", registry.url, out)
    scored = [read(m.value()) for m in results]
    outcomes = [d["request_id"] for d in scored]
    request = AvroDeserializer(SchemaRegistryClient({"url": registry.url}))  # a dead letter holds the request
    dead_ids = {request(m.value(), None)["request_id"]: dict(m.headers())[H_ERROR].decode() for m in dead}
    assert len(outcomes) == len(set(outcomes)), "a request was scored twice"
    assert set(outcomes) | set(dead_ids) == set(sent) and not set(outcomes) & set(dead_ids)  # one outcome each
    assert {rid for rid, kind in sent.items() if kind != "unseen-down"} == set(outcomes)
    assert set(dead_ids) == {rid for rid, kind in sent.items() if kind == "unseen-down"}
    for reason in dead_ids.values():
        assert reason.startswith("schema id ") and "could not be fetched from the schema registry (" in reason, reason
        assert reason.endswith(f"within the request's deadline ({SLO_MS:.0f} ms after its timestamp)"), reason
