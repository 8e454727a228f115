"""The real schema registry of the tests (Apicurio Registry's Confluent-compatible API,
conftest.py `schema_registry`) with confluent-kafka's own client and serializers: what
the Avro and Protobuf codecs of issue 48 will stand on. docs/SCHEMA_REGISTRY.md."""

from __future__ import annotations

import json
import socket
import struct
import uuid
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tests.integration.apicurio_dist import RegistryDistError, ensure_dist
from tests.integration.schema_registry import RegistryError, SchemaRegistry


def _avro(*extra_fields: dict) -> str:
    fields = [{"name": "user", "type": "string"}, {"name": "ad", "type": "long"}, *extra_fields]
    return json.dumps({"type": "record", "name": "Click", "namespace": "tidebatch.test", "fields": fields})


CLICK_V1 = _avro()
# Backward compatible: a reader of v2 reads v1 data (the new field has a default).
CLICK_V2 = _avro({"name": "campaign", "type": "string", "default": "none"})
# Not: a v3 reader cannot read v2 data (no default for the new field).
CLICK_V3 = _avro({"name": "campaign", "type": "string", "default": "none"}, {"name": "price", "type": "double"})


def _value_context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def _schema_id(framed: bytes) -> int:
    """The Confluent wire format: magic byte 0, then the schema id (big-endian int32)."""
    assert framed[0] == 0, framed[:5]
    return int(struct.unpack(">i", framed[1:5])[0])


def _reader_client(url: str) -> SchemaRegistryClient:
    """A second client, as a consumer in another process has: SchemaRegistryClient
    caches every schema it registered, so a reader sharing the writer's client would
    never ask the registry for the writer's schema."""
    return SchemaRegistryClient({"url": url})


def test_avro_round_trip_and_compatible_evolution(schema_registry: str) -> None:
    client = SchemaRegistryClient({"url": schema_registry})
    topic = f"clicks-{uuid.uuid4().hex[:12]}"
    subject = f"{topic}-value"  # TopicNameStrategy, the serializers' default
    ctx = _value_context(topic)

    v1_bytes = AvroSerializer(client, CLICK_V1)({"user": "u1", "ad": 7}, ctx)
    v1 = client.get_latest_version(subject)
    assert (v1.version, _schema_id(v1_bytes)) == (1, v1.schema_id)
    assert AvroDeserializer(_reader_client(schema_registry))(v1_bytes, ctx) == {"user": "u1", "ad": 7}

    client.set_compatibility(subject, "BACKWARD")
    assert client.test_compatibility(subject, Schema(CLICK_V2, "AVRO"))
    v2_bytes = AvroSerializer(client, CLICK_V2)({"user": "u2", "ad": 8, "campaign": "spring"}, ctx)
    # get_version, not get_latest_version: the client caches "latest" with no TTL
    # unless cache.latest.ttl.sec is set, so it would still say version 1 here.
    v2 = client.get_version(subject, 2)
    assert _schema_id(v2_bytes) == v2.schema_id
    assert v2.schema_id != v1.schema_id
    assert client.get_versions(subject) == [1, 2]

    # A new writer id mid-stream: the same deserializer fetches it and reads both.
    reader = AvroDeserializer(_reader_client(schema_registry))
    assert reader(v1_bytes, ctx) == {"user": "u1", "ad": 7}
    assert reader(v2_bytes, ctx) == {"user": "u2", "ad": 8, "campaign": "spring"}
    # With v2 as the reader schema, v1 data gets the default.
    assert AvroDeserializer(_reader_client(schema_registry), CLICK_V2)(v1_bytes, ctx) == {"user": "u1", "ad": 7, "campaign": "none"}

    # The registry enforces the subject's compatibility: it checks, not just stores.
    assert not client.test_compatibility(subject, Schema(CLICK_V3, "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(CLICK_V3, "AVRO"))
    assert refused.value.http_status_code == 409
    assert client.get_versions(subject) == [1, 2]


def _click_message_class() -> type:
    """A Protobuf message class built at run time from its descriptor, as protoc's
    generated module does (it registers a serialized FileDescriptorProto), so the test
    needs no protoc."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"tidebatch/test/click_{uuid.uuid4().hex[:8]}.proto", package="tidebatch.test", syntax="proto3"
    )
    click = proto.message_type.add(name="Click")
    click.field.add(name="user", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    click.field.add(name="ad", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    click.field.add(name="features", number=3, type=field.TYPE_FLOAT, label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tidebatch.test.Click"))


def test_protobuf_round_trip(schema_registry: str) -> None:
    client = SchemaRegistryClient({"url": schema_registry})
    topic = f"clicks-pb-{uuid.uuid4().hex[:12]}"
    ctx = _value_context(topic)
    click_class = _click_message_class()
    sent = click_class(user="u1", ad=7, features=[0.5, 1.5])

    framed = ProtobufSerializer(click_class, client)(sent, ctx)
    registered = client.get_latest_version(f"{topic}-value")
    assert registered.schema.schema_type == "PROTOBUF"
    assert _schema_id(framed) == registered.schema_id

    got = ProtobufDeserializer(click_class, {}, _reader_client(schema_registry))(framed, ctx)
    assert got == sent


def test_json_schema_round_trip(schema_registry: str) -> None:
    client = SchemaRegistryClient({"url": schema_registry})
    topic = f"clicks-js-{uuid.uuid4().hex[:12]}"
    ctx = _value_context(topic)
    schema = json.dumps({
        "$schema": "http://json-schema.org/draft-07/schema#", "title": "Click", "type": "object",
        "properties": {"user": {"type": "string"}, "ad": {"type": "integer"}}, "required": ["user", "ad"],
    })
    framed = JSONSerializer(schema, client)({"user": "u1", "ad": 7}, ctx)
    assert client.get_latest_version(f"{topic}-value").schema.schema_type == "JSON"
    assert JSONDeserializer(None, schema_registry_client=_reader_client(schema_registry))(framed, ctx) == {"user": "u1", "ad": 7}


def test_schemas_and_ids_survive_a_restart(schema_registry_server: SchemaRegistry) -> None:
    """stop() then start(): an outage, not a wiped registry (H2 file storage), on the
    same URL, so a codec's cached ids stay right."""
    registry = schema_registry_server
    subject = f"restart-{uuid.uuid4().hex[:12]}-value"
    schema_id = SchemaRegistryClient({"url": registry.url}).register_schema(subject, Schema(CLICK_V1, "AVRO"))
    url = registry.url
    try:
        registry.stop()
        assert not registry.answers(timeout=0.5)
    finally:
        registry.start()
    assert registry.url == url
    fresh = SchemaRegistryClient({"url": url})  # no cache: the answer is the registry's
    assert fresh.get_latest_version(subject).schema_id == schema_id
    assert json.loads(fresh.get_schema(schema_id).schema_str) == json.loads(CLICK_V1)


def test_unreachable_maven_central_is_a_one_line_error(tmp_path: Path) -> None:
    """A mirror nobody answers on and an empty local repository: what a machine without
    Maven Central sees on its first fetch (scripts/ensure_registry.sh prints this line)."""
    settings = tmp_path / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>"
    )
    with pytest.raises(RegistryDistError) as caught:
        ensure_dist("2.6.13.Final", tmp_path / "home",
                    mvn_args=["-s", str(settings), f"-Dmaven.repo.local={tmp_path / 'repo'}"])
    message = str(caught.value)
    assert message.startswith("cannot fetch Apicurio Registry") and "\n" not in message, message
    assert "127.0.0.1:9" in message, message  # mvn's own reason, not ours
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == [".lock"]  # no staging left


def test_a_failed_start_names_its_cause_and_shows_the_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        registry = SchemaRegistry(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(RegistryError) as caught:
            registry.start()
    message = str(caught.value)
    assert "exited during start" in message and "seems to be in use" in message.splitlines()[0], message
    assert str(registry.log_path) in message and len(message.splitlines()) > 1  # the log's tail follows
    assert not registry.running
