"""Records in Confluent's schema-registry wire format (a magic byte, the writer's schema
id, the payload) to and from documents, with confluent-kafka's own serializers and
deserializers (fastavro for Avro, protobuf, jsonschema): nothing here reads or writes
the framing by hand.

- RecordWriter: documents of one type as records, its schema (made from the type:
  schema_render.py, schema_proto.py) registered under `<topic>-value` on first use
  (TopicNameStrategy, so a consumer with the stock deserializer finds it).
- RecordReader: records of any writer schema as documents. The writer's schema is
  looked up by the id alone (no subject: no association or subject lookups, no
  `?subject=` query), so a new writer id mid-stream is read with its own schema.
  Protobuf records are parsed into the reader's message class (the request type's
  fields by number; a newer writer's extra fields are skipped).

The client is handed in (pipeline/registry/schema_settings.py makes it): it caches
every schema by id for good, so reading a record of a known id asks the registry
nothing. Nothing here knows Kafka clients.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from confluent_kafka.schema_registry import topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.common.serde import SchemaId
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from pipeline.codecs.record_types import Record, sample
from pipeline.codecs.schema_proto import fill, message_class, proto_file, to_dict
from pipeline.codecs.schema_render import avro_schema, json_schema

FORMATS = ("avro", "protobuf", "jsonschema")
SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "jsonschema": "JSON"}  # the registry's words
NAMESPACE = "tidebatch"  # Avro namespace, Protobuf package


def _by_id_only(_ctx: Any, _record_name: Any) -> None:
    """A subject name strategy that names none: the writer's schema is fetched by its
    id alone (confluent-kafka's default, ASSOCIATED, asks the registry which subject a
    topic has, on the caller's thread)."""
    return None


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def protobuf_class(record: Record) -> type:
    """The message class of documents of type `record`."""
    fdp = proto_file(record, NAMESPACE, f"{NAMESPACE}/{record.name}.proto")
    return message_class(fdp, f"{NAMESPACE}.{record.name}")


class RecordWriter:
    """Documents of type `record` as records of `topic`, in format `fmt`."""

    def __init__(self, fmt: str, record: Record, client: Any, topic: str) -> None:
        self.fmt = check_format(fmt)
        self.record = record
        self.subject = f"{topic}-value"
        self._ctx = SerializationContext(topic, MessageField.VALUE)
        conf = {"subject.name.strategy": topic_subject_name_strategy, "auto.register.schemas": True}
        self._message: type | None = None
        if fmt == "avro":
            self._serialize: Any = AvroSerializer(client, avro_schema(record, NAMESPACE), conf=conf)
        elif fmt == "jsonschema":  # no jsonschema validation: a document made to the schema (~1 ms a CTR result)
            self._serialize = JSONSerializer(json_schema(record), client, conf={**conf, "validate": False})
        else:
            self._message = protobuf_class(record)
            self._serialize = ProtobufSerializer(self._message, client, conf)

    def __call__(self, doc: Mapping[str, Any]) -> bytes:
        """The record of `doc`. The first call registers the schema (a registry call);
        later ones use the id it got. Raises confluent-kafka's errors, or ValueError /
        TypeError for a document that does not fit."""
        value = fill(self._message(), doc) if self._message is not None else doc
        return self._serialize(value, self._ctx)

    def register(self) -> None:
        """Register the schema now (the first record's registration, made with a sample
        document), so that no later record waits for the registry."""
        self(sample(self.record))


class RecordReader:
    """Records in format `fmt`, whatever their writer schema, as documents; `record`:
    the reader's type (Protobuf parses into its message class)."""

    def __init__(self, fmt: str, client: Any, record: Record) -> None:
        self.fmt = check_format(fmt)
        self.client = client
        self.schema_type = SCHEMA_TYPES[fmt]
        conf = {"subject.name.strategy": _by_id_only}
        self._protobuf = fmt == "protobuf"
        if fmt == "avro":
            self._deserialize: Any = AvroDeserializer(client, conf=conf)
        elif fmt == "jsonschema":
            # Not validated against the writer's schema (3.5 ms a CTR request, 100x its decode:
            # bench/schema_codecs.py): the inner codec checks every field it reads, with its own reasons.
            self._deserialize = JSONDeserializer(None, schema_registry_client=client, conf={**conf, "validate": False})
        else:
            self._deserialize = ProtobufDeserializer(protobuf_class(record), conf, client)

    def schema_id(self, value: bytes) -> SchemaId:
        """The writer's schema id (or guid) from the record's framing; confluent-kafka's
        SerializationError for a bad magic byte, EOFError for a record cut short."""
        sid = SchemaId(self.schema_type)
        sid.from_bytes(io.BytesIO(value))
        return sid

    def writer_type(self, sid: SchemaId) -> str:
        """The registry's type of the writer's schema (AVRO, PROTOBUF, JSON). From the
        client's cache once the schema was fetched."""
        if sid.id is not None:
            schema = self.client.get_schema(sid.id)
        else:
            schema = self.client.get_schema_by_guid(str(sid.guid))
        return schema.schema_type or "AVRO"  # the registry leaves out the type of an Avro schema

    def __call__(self, value: bytes) -> dict[str, Any]:
        """The record's document. Fetches the writer's schema if the client does not
        have it yet (a registry call on the caller's thread)."""
        obj = self._deserialize(value, None)
        return to_dict(obj) if self._protobuf else obj
