"""A document type (record_types.py) as an Avro schema or a JSON Schema, the text a
confluent-kafka serializer registers (Protobuf: schema_proto.py).

Avro: a record per Record (named once, referred to by name after), arrays, maps with
string keys; an optional field is the union ["null", T] with default null, so a writer
may leave it out and a reader of an older version still finds it. JSON Schema
(draft-07, the draft confluent-kafka's JSON serializer validates with): objects whose
optional fields may be null or absent.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.codecs.record_types import ListOf, MapOf, Record, Scalar, Type

_JSON_TYPES = {"string": "string", "boolean": "boolean", "int": "integer", "long": "integer",
               "float": "number", "double": "number"}


def avro_schema(root: Record, namespace: str) -> str:
    """The Avro schema of documents of type `root`, in `namespace`."""
    named: set[str] = set()

    def of(t: Type) -> Any:
        if isinstance(t, Scalar):
            return t.kind
        if isinstance(t, ListOf):
            return {"type": "array", "items": of(t.items)}
        if isinstance(t, MapOf):
            return {"type": "map", "values": of(t.values)}
        if t.name in named:
            return t.name
        named.add(t.name)
        return {"type": "record", "name": t.name, "fields": [
            {"name": f.name, "type": ["null", of(f.type)], "default": None} if f.optional
            else {"name": f.name, "type": of(f.type)}
            for f in t.fields
        ]}

    top = of(root)
    return json.dumps({"type": "record", "name": root.name, "namespace": namespace,
                       "fields": top["fields"]}, separators=(",", ":"))


def json_schema(root: Record) -> str:
    """The JSON Schema (draft-07) of documents of type `root`."""

    def of(t: Type) -> dict[str, Any]:
        if isinstance(t, Scalar):
            return {"type": _JSON_TYPES[t.kind]}
        if isinstance(t, ListOf):
            return {"type": "array", "items": of(t.items)}
        if isinstance(t, MapOf):
            return {"type": "object", "additionalProperties": of(t.values)}
        properties = {f.name: {"anyOf": [of(f.type), {"type": "null"}]} if f.optional else of(f.type)
                      for f in t.fields}
        return {"type": "object", "properties": properties,
                "required": [f.name for f in t.fields if not f.optional]}

    return json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": root.name, **of(root)},
                      separators=(",", ":"))
