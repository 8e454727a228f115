"""Reading schema-registry results as a consumer of them would: confluent-kafka's own
deserializers with a client of their own (a client shares nothing with the worker's),
for tests/integration/test_schema_codecs_e2e.py and test_schema_outage.py."""

from __future__ import annotations

import base64
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pipeline.codecs.schema_proto import to_dict


def stock_reader(fmt: str, url: str, topic: str) -> Any:
    """value -> document, by the stock deserializer of `fmt`. Protobuf needs the message
    class: made from the file registered under `<topic>-value`, as protoc would."""
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    if fmt == "avro":
        reader = AvroDeserializer(client)
        return lambda value: reader(value, ctx)
    if fmt == "jsonschema":
        reader = JSONDeserializer(None, schema_registry_client=client)
        return lambda value: reader(value, ctx)
    registered = client.get_latest_version(f"{topic}-value").schema.schema_str
    fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(registered))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{fdp.package}.{fdp.message_type[0].name}"))
    reader = ProtobufDeserializer(cls, {}, client)
    return lambda value: to_dict(reader(value, ctx))


def same_result(a: dict[str, Any], b: dict[str, Any], fields: tuple[str, ...]) -> bool:
    """Two results of one request agree on what the model and the request decide
    (times and offsets differ between two runs)."""
    return all(a.get(f) == b.get(f) for f in fields)
