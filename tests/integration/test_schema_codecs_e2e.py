"""Issue 48: requests in Avro and Protobuf through a real schema registry (Apicurio,
conftest.py `schema_registry`) and Apache Kafka, for the CTR pipeline and for a model
the project never saw, sent by `tidebatch produce --format`'s code; results read back
with confluent-kafka's own deserializer (a client of their own) and compared with the
JSON path's results for the same requests; a schema change mid-stream; records that are
not the pipeline's (an unknown schema id, JSON, a bad magic byte) dead-lettered with
their reason. docs/SCHEMA_REGISTRY.md."""

from __future__ import annotations

import struct

import orjson
import pytest

from consumers.dead_letter import H_ERROR
from pipeline.app.produce import produce
from pipeline.codecs.record_types import STRING, Field, Record
from pipeline.codecs.schema_records import RecordWriter
from pipeline.config import load_config
from pipeline.registry.schema_settings import SchemaRegistryConfig
from tests.integration.pipeline_helpers import (
    produce_values,
    read_topic,
    result_docs,
    running_worker,
    worker_config,
)
from tests.integration.schema_helpers import stock_reader
from tests.own_models import ranker

SAME = ("request_id", "key", "model", "model_version", "priority")  # what two runs of a request share
N = 60


# Each request scored alone (policy none) on both paths: ONNX Runtime's float sums
# depend on the batch a row is in, and the two paths' batches differ; alone, the same
# features give the same scores bit for bit.
ALONE = {"policy": "none"}


def _workers(kafka_broker, topics, group: str, **fmt_extra):
    """(the JSON path's worker config, the schema-registry path's), on their own topics."""
    b = kafka_broker.bootstrap_servers
    json_cfg = worker_config(b, topics["json_in"], topics["json_out"], f"{group}-json", batching=ALONE)
    fmt_cfg = worker_config(b, topics["in"], topics["out"], group, dlq_topic=topics["dlq"], batching=ALONE, **fmt_extra)
    return json_cfg, fmt_cfg


def _topics(factory, name: str) -> dict[str, str]:
    topics = {k: factory(f"{name}-{k}", partitions=2) for k in ("json_in", "json_out", "in", "out")}
    topics["dlq"] = factory(f"{topics['in']}.dlq", exact=True)
    return topics


def _by_id(docs: list[dict]) -> dict[str, dict]:
    out = {d["request_id"]: d for d in docs}
    assert len(out) == len(docs), "a request got two results"
    return out


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_ctr_requests_score_as_their_json_and_bad_records_name_their_reason(
        fmt, kafka_broker, kafka_topic_factory, schema_registry, unique_group_id):
    b = kafka_broker.bootstrap_servers
    topics = _topics(kafka_topic_factory, f"ctr-{fmt}")
    registry = SchemaRegistryConfig(url=schema_registry)
    json_cfg, fmt_cfg = _workers(kafka_broker, topics, unique_group_id,
                                 schema_registry={"url": schema_registry, "format": fmt})
    bad = [
        # an id nobody registered (then the Protobuf framing's message index, [0], or an Avro string)
        (b"\x00" + struct.pack(">I", 987_654) + (b"\x00" if fmt == "protobuf" else b"\x02a"),
         "schema id 987654 is not in the schema registry (HTTP 404"),
        (b'{"request_id": "j1", "context": {}, "items": [{"item_id": "a"}]}',
         "not a schema-registry record: magic byte 0x7b (a JSON request?), expected 0x00"),
        (b"\x05\x00\x00\x00\x01payload", "not a schema-registry record: magic byte 0x05, expected 0x00"),
    ]
    with running_worker(json_cfg), running_worker(fmt_cfg):
        produce(b, "ctr", 2000, N, topic=topics["json_in"], seed=11, profile=kafka_broker.profile)
        produce(b, "ctr", 2000, N, topic=topics["in"], seed=11, profile=kafka_broker.profile,
                records=fmt, schema_registry=registry)
        produce_values(b, topics["in"], [(None, value) for value, _ in bad])
        json_results = _by_id(result_docs(read_topic(b, topics["json_out"], N, timeout=120)))
        records = read_topic(b, topics["out"], N, timeout=120)
        dead = read_topic(b, topics["dlq"], len(bad), timeout=60)
    read = stock_reader(fmt, schema_registry, topics["out"])
    results = _by_id([read(m.value()) for m in records])
    assert results.keys() == json_results.keys() and len(results) == N
    for rid, doc in results.items():
        want = json_results[rid]
        assert [doc[k] for k in SAME] == [want[k] for k in SAME]
        assert doc["item_ids"] == want["item_ids"] and doc["scores"] == want["scores"], rid  # bit for bit
    reasons = sorted(dict(m.headers())[H_ERROR].decode() for m in dead)
    assert len(reasons) == len(bad)
    for (_value, reason), got in zip(sorted(bad, key=lambda x: x[1]), reasons, strict=True):
        assert got.startswith(reason), got


def _own_config(kafka_broker, model, codec: str, inp: str, out: str, group: str, **extra):
    entry = {"name": "own-ranker", "model": str(model), "codec": codec, "input_topic": inp, "output_topic": out,
             "inputs": {"features": "dense", "tokens": "tokens"}, "outputs": {"score": "prob", "hidden": "hidden"},
             "sample_dims": {"seq": 3}}
    return load_config(overrides={
        "pipeline": "own-ranker", "pipelines": [entry], "bootstrap_servers": kafka_broker.bootstrap_servers,
        "broker_profile": kafka_broker.profile, "group_id": group, "metrics": {"enabled": False},
        "create_topics": False, "batching": ALONE, **extra}, environ={})


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_own_model_requests_score_as_their_json(fmt, kafka_broker, kafka_topic_factory, schema_registry,
                                                unique_group_id, tmp_path):
    """A `pipelines:` entry with `codec: avro` (protobuf) beside the same entry with
    tensor-json: `tidebatch produce` sends the same sample requests to each (the
    entry's codec decides the form), and each result is the JSON path's."""
    b = kafka_broker.bootstrap_servers
    model = ranker(tmp_path / "ranker.onnx")
    topics = _topics(kafka_topic_factory, f"own-{fmt}")
    json_cfg = _own_config(kafka_broker, model, "tensor-json", topics["json_in"], topics["json_out"],
                           f"{unique_group_id}-json")
    fmt_cfg = _own_config(kafka_broker, model, fmt, topics["in"], topics["out"], unique_group_id,
                          schema_registry={"url": schema_registry})
    with running_worker(json_cfg), running_worker(fmt_cfg):
        produce(b, "own-ranker", 2000, N, seed=5, profile=kafka_broker.profile, defined=json_cfg.pipelines)
        produce(b, "own-ranker", 2000, N, seed=5, profile=kafka_broker.profile, defined=fmt_cfg.pipelines,
                schema_registry=fmt_cfg.schema_registry)  # the entry's codec: records of its format
        json_results = _by_id(result_docs(read_topic(b, topics["json_out"], N, timeout=120)))
        records = read_topic(b, topics["out"], N, timeout=120)
    results = _by_id([stock_reader(fmt, schema_registry, topics["out"])(m.value()) for m in records])
    assert results.keys() == json_results.keys() and len(results) == N
    for rid, doc in results.items():
        want = json_results[rid]
        assert [doc[k] for k in SAME] == [want[k] for k in SAME]
        assert doc["score"] == want["score"] and doc["hidden"] == want["hidden"], rid


def test_a_new_writer_schema_mid_stream_is_read_without_a_restart(kafka_broker, kafka_topic_factory,
                                                                  schema_registry, unique_group_id):
    """v1 records, then v2 (one optional field more, BACKWARD compatible) on the same
    topic to the same running worker: every request scored, nothing dead-lettered."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from pipeline.codecs.ctr import ctr_request_type
    from pipeline.loadgen.ctr import CtrRequestFactory

    b = kafka_broker.bootstrap_servers
    inp, out = kafka_topic_factory("evolve-in", partitions=2), kafka_topic_factory("evolve-out", partitions=2)
    dlq = kafka_topic_factory(f"{inp}.dlq", exact=True)
    cfg = worker_config(b, inp, out, unique_group_id, dlq_topic=dlq,
                        schema_registry={"url": schema_registry, "format": "avro"})
    client = SchemaRegistryClient({"url": schema_registry})
    v1 = ctr_request_type("CtrRequest")
    v2 = Record(v1.name, (*v1.fields, Field("campaign", STRING, optional=True)))
    factory = CtrRequestFactory(seed=4)
    docs = [orjson.loads(factory.make(i)[1]) for i in range(2 * N)]
    with running_worker(cfg):
        first = RecordWriter("avro", v1, client, inp)
        produce_values(b, inp, [(None, first(d)) for d in docs[:N]])
        assert len(read_topic(b, out, N, timeout=120)) == N
        client.set_compatibility(f"{inp}-value", "BACKWARD")
        second = RecordWriter("avro", v2, client, inp)
        values = [second({**d, "campaign": f"spring-{i}"}) for i, d in enumerate(docs[N:])]
        assert values[0][1:5] != first(docs[0])[1:5]  # a new writer id
        produce_values(b, inp, [(None, v) for v in values])
        results = read_topic(b, out, 2 * N, timeout=120)
    assert len(results) == 2 * N
    assert len(read_topic(b, dlq, 1, timeout=2)) == 0


def test_tidebatch_produce_sends_records_a_stock_consumer_reads(kafka_broker, kafka_topic_factory, schema_registry):
    """`tidebatch produce ctr --format protobuf --schema-registry URL`: the requests of
    `produce ctr` (same seed) as Protobuf records, their schema under <topic>-value."""
    import subprocess
    import sys

    from tests.integration.pipeline_helpers import REPO

    b = kafka_broker.bootstrap_servers
    plain, framed = kafka_topic_factory("produce-json"), kafka_topic_factory("produce-pb")
    common = [sys.executable, "-m", "pipeline.cli", "produce", "ctr", "--bootstrap-servers", b, "--broker-profile",
              kafka_broker.profile, "--count", "20", "--rate", "1000", "--seed", "3", "--quiet"]
    for topic, extra in ((plain, []), (framed, ["--format", "protobuf", "--schema-registry", schema_registry])):
        done = subprocess.run([*common, "--topic", topic, *extra], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    read = stock_reader("protobuf", schema_registry, framed)
    got = sorted((read(m.value()) for m in read_topic(b, framed, 20)), key=lambda d: d["request_id"])
    want = sorted(result_docs(read_topic(b, plain, 20)), key=lambda d: d["request_id"])
    assert len(got) == len(want) == 20
    for g, w in zip(got, want, strict=True):
        assert g["request_id"] == w["request_id"] and len(g["items"]) == len(w["items"])
        assert [i["item_id"] for i in g["items"]] == [i["item_id"] for i in w["items"]]
        assert g["context"] == {k: v for k, v in w["context"].items() if v is not None}
