"""The codecs avro, protobuf, jsonschema (pipeline/codecs/schema_wire.py): a request in
any of them decodes to the very arrays its JSON form gives (one path from a document to
feeds: the inner codec's decode_document), and a result document is written with a
schema made from its fields that confluent-kafka's stock deserializers read back as the
JSON path has it. confluent-kafka's in-memory mock:// registry stands in for a real one
here; tests/integration/test_schema_codecs_e2e.py runs the real one."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from consumers.records import SourceRecord
from models.registry import ModelSpec
from pipeline.codecs.base import Decoded, NotReady
from pipeline.codecs.ctr import CtrCodec
from pipeline.codecs.record_types import FLOAT, STRING, Field, ListOf, MapOf, Record, result_record
from pipeline.codecs.schema_proto import to_dict
from pipeline.codecs.schema_records import FORMATS, RecordWriter
from pipeline.codecs.schema_wire import SchemaWireCodec
from pipeline.codecs.tensor_json import TensorJsonCodec
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.registry.schema_fetch import SchemaFetcher
from pipeline.registry.user_pipelines import sample_fields
from pipeline.runtime.onnx_graph import TensorInfo
from pipeline.scoring import BatchTiming, result_document

INPUTS = [TensorInfo("dense", "tensor(float)", ("batch", 4)), TensorInfo("tokens", "tensor(int64)", ("batch", "seq")),
          TensorInfo("image", "tensor(float)", ("batch", 2, 3)), TensorInfo("flag", "tensor(bool)", ("batch",)),
          TensorInfo("word", "tensor(string)", ("batch", 2))]
OUTPUTS = [TensorInfo("prob", "tensor(float)", ("batch", 1)), TensorInfo("label", "tensor(int64)", ("batch",)),
           TensorInfo("probabilities", "seq(map(int64,tensor(float)))", None)]


def mock_client() -> Any:
    return SchemaRegistryClient.new_client({"url": "mock://unit"})


def schema_codec(fmt: str, inner: Any, client: Any, pipeline: str = "ranker") -> tuple[SchemaWireCodec, SchemaFetcher]:
    fetcher = SchemaFetcher(lambda: 0.0, thread=False)
    return SchemaWireCodec(fmt, inner, client, fetcher, pipeline, f"{pipeline}.results"), fetcher


def decoded(codec: SchemaWireCodec, fetcher: SchemaFetcher, value: bytes) -> Decoded:
    """The first record of an id waits for its schema (NotReady); fetched, it decodes."""
    try:
        return codec.decode(value)
    except NotReady as waiting:
        assert not waiting.ready()
        fetcher.step()
        assert waiting.ready()
        return codec.decode(value)


def same_payload(a: Any, b: Any) -> None:
    left = a if isinstance(a, dict) else {"dense": a.dense, "cat": a.cat}
    right = b if isinstance(b, dict) else {"dense": b.dense, "cat": b.cat}
    assert left.keys() == right.keys()
    for name in left:
        assert left[name].dtype == right[name].dtype and left[name].shape == right[name].shape, name
        np.testing.assert_array_equal(left[name], right[name], err_msg=name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ctr_requests_in_each_format_give_the_json_forms_features(fmt: str) -> None:
    inner, client = CtrCodec(), mock_client()
    codec, fetcher = schema_codec(fmt, inner, client, "ctr")
    writer = RecordWriter(fmt, codec.request, client, "ctr.requests")
    factory = CtrRequestFactory(seed=3)
    for i in range(40):  # features null in about half of them, left out in the others
        _key, value = factory.make(i)
        doc = orjson.loads(value)
        if i % 3 == 0:
            doc.update(priority=i % 10, deadline_ms=500 + i, tenant="acme")
        got, want = decoded(codec, fetcher, writer(doc)), inner.decode(orjson.dumps(doc))
        assert (got.request_id, got.rows, got.priority, got.deadline_ms, got.tenant, got.extra) == (
            want.request_id, want.rows, want.priority, want.deadline_ms, want.tenant, want.extra)
        same_payload(got.payload, want.payload)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", ["one", "many"])
def test_own_model_requests_in_each_format_give_the_json_forms_arrays(fmt: str, rows: str) -> None:
    inner, client = TensorJsonCodec(INPUTS, OUTPUTS, rows=rows), mock_client()
    codec, fetcher = schema_codec(fmt, inner, client)
    writer = RecordWriter(fmt, codec.request, client, "ranker.requests")
    rng = np.random.default_rng(5)
    for i in range(5):
        doc = {"request_id": f"r{i}", "tenant": "acme", **sample_fields(inner.fields, inner.many, rng, {"seq": 2 + i})}
        doc["flag"] = [True, False] if rows == "many" else True
        got, want = decoded(codec, fetcher, writer(doc)), inner.decode(orjson.dumps(doc))
        assert (got.request_id, got.rows, got.tenant, got.bucket) == (want.request_id, want.rows, "acme", want.bucket)
        same_payload(got.payload, want.payload)
    feeds = codec.collate([got.payload], pad_to_rows=4)
    assert feeds["dense"].shape == (4, 4)


def test_the_request_and_result_types_follow_the_graph() -> None:
    inner = TensorJsonCodec(INPUTS, OUTPUTS, rows="many")
    request = {f.name: f for f in inner.request_type("R").fields}
    assert request["dense"].type == ListOf(ListOf(FLOAT))  # rows, then the input's 4
    assert request["image"].type == ListOf(ListOf(ListOf(FLOAT)))
    assert [f.name for f in request.values() if f.optional] == ["priority", "deadline_ms", "tenant"]
    result = dict((f.name, f.type) for f in inner.result_fields())
    assert result["probabilities"] == ListOf(MapOf(FLOAT))  # a map per row
    assert result["label"].items.kind == "long"


def _result_doc(codec: Any, decoded_request: Decoded, result: dict[str, Any]) -> dict[str, Any]:
    model = ModelSpec("m", "3", None, [], [], {})  # type: ignore[arg-type]
    rec = SourceRecord("ranker.requests", 2, 41, b"user-1", b"", {}, 1_700_000_000_000)
    return result_document(model, decoded_request, rec, result, BatchTiming(4, 0.0012, 1_700_000_000_005,
                                                                           1_700_000_000_007), 1_700_000_000_001, 1e13)


def test_the_result_record_has_every_field_the_result_document_writes() -> None:
    inner = TensorJsonCodec(INPUTS, OUTPUTS)
    d = Decoded("r1", 1, None, tenant="acme")
    doc = _result_doc(inner, d, {"prob": [0.5], "label": 1, "probabilities": {"0": 0.5, "1": 0.5}})
    record = result_record("R", inner.result_fields())
    assert [f.name for f in record.fields] == list(doc)
    source = next(f.type for f in record.fields if f.name == "source")
    assert [f.name for f in source.fields] == list(doc["source"])


def _stock_reader(fmt: str, client: Any, subject: str) -> Any:
    """What a consumer of the results runs: confluent-kafka's own deserializer (for
    Protobuf, with the message class of the registered file, as protoc would make it)."""
    if fmt == "avro":
        return AvroDeserializer(client)
    if fmt == "jsonschema":
        return JSONDeserializer(None, schema_registry_client=client)
    fdp = descriptor_pb2.FileDescriptorProto.FromString(
        base64.b64decode(client.get_latest_version(subject).schema.schema_str))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{fdp.package}.{fdp.message_type[0].name}"))
    return lambda value, ctx: to_dict(ProtobufDeserializer(cls, {}, client)(value, ctx))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", ["one", "many"])
def test_results_read_back_with_the_stock_deserializer_as_the_json_path_has_them(fmt: str, rows: str) -> None:
    from confluent_kafka.serialization import MessageField, SerializationContext

    inner, client = TensorJsonCodec(INPUTS, OUTPUTS, rows=rows), mock_client()
    codec, _ = schema_codec(fmt, inner, client)
    codec.register_results()
    n = 2 if rows == "many" else 1
    outputs = {"prob": np.array([[0.25], [0.75]], np.float32)[:n], "label": np.array([1, 0], np.int64)[:n],
               "probabilities": [{0: 0.125, 1: 0.875}, {0: 1.0, 1: 0.0}][:n]}
    d = Decoded("r1", n, None, priority=2, tenant=None)
    doc = _result_doc(inner, d, inner.split(outputs, [d])[0])
    value = codec.encode_result(doc)
    assert value[0] == 0
    json_path = orjson.loads(orjson.dumps(doc))
    read = _stock_reader(fmt, client, "ranker.results-value")(value, SerializationContext("ranker.results", MessageField.VALUE))
    if fmt != "jsonschema":  # Avro and Protobuf carry absent optionals as null / unset
        json_path = {k: v for k, v in json_path.items() if v is not None}
        read = {k: v for k, v in read.items() if v is not None}
    assert read == json_path


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_ctr_result_reads_back_as_the_json_path_has_it(fmt: str) -> None:
    inner, client = CtrCodec(), mock_client()
    codec, _ = schema_codec(fmt, inner, client, "ctr")
    d = inner.decode(CtrRequestFactory(seed=1).make(0)[1])
    scores = np.linspace(0.1, 0.9, d.rows, dtype=np.float32)
    doc = _result_doc(inner, d, inner.split({"prob": scores}, [d])[0])
    value = codec.encode_result(doc)
    from confluent_kafka.serialization import MessageField, SerializationContext

    read = _stock_reader(fmt, client, "ctr.results-value")(value, SerializationContext("ctr.results", MessageField.VALUE))
    json_path = orjson.loads(orjson.dumps(doc))
    assert read["scores"] == json_path["scores"] and read["item_ids"] == json_path["item_ids"]


def test_a_new_writer_schema_mid_stream_decodes_with_its_own_fields() -> None:
    """Schema evolution: v2 adds a field the codec does not read; records of v1 and v2
    decode alike, each with its own writer schema, the new id fetched once."""
    inner, client = TensorJsonCodec(INPUTS[:2], OUTPUTS[:1]), mock_client()
    codec, fetcher = schema_codec("avro", inner, client)
    v1 = RecordWriter("avro", codec.request, client, "ranker.requests")
    v2_type = Record(codec.request.name, (*codec.request.fields, Field("campaign", STRING, optional=True)))
    v2 = RecordWriter("avro", v2_type, client, "ranker.requests")
    doc = {"request_id": "r", "dense": [1.0, 2.0, 3.0, 4.0], "tokens": [1, 2]}
    a = decoded(codec, fetcher, v1(doc))
    b = decoded(codec, fetcher, v2({**doc, "campaign": "spring"}))
    assert v1(doc)[1:5] != v2(doc)[1:5]  # two writer ids
    same_payload(a.payload, b.payload)


def test_a_field_that_cannot_be_a_schema_field_is_refused_naming_it() -> None:
    inner = TensorJsonCodec([TensorInfo("input.1", "tensor(float)", ("N", 2))], OUTPUTS[:1])
    with pytest.raises(ValueError, match=r"request field 'input\.1' cannot name a schema field .* inputs:/outputs:"):
        schema_codec("avro", inner, mock_client())
    with pytest.raises(ValueError, match="codec text has no document form"):
        schema_codec("avro", type("T", (), {"name": "text"})(), mock_client())
