"""The fields of a request or result document, as the schema-registry codecs
(schema_wire.py) describe them: one small type model from which the Avro, JSON Schema
(schema_render.py) and Protobuf (schema_proto.py) schemas are all made, so the three
formats cannot disagree about a document.

Requests: a codec with a document form says what its requests hold (`request_type`:
the CTR request of ctr.py; tensor-json's from the model's inputs, `tensor_field`).
Results: the codec's own result fields (`result_fields`) inside the result document
that pipeline/scoring.py `result_document` writes around them (`result_record`; a unit
test holds the two together).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.runtime.onnx_graph import DTYPES

SCALARS = ("string", "boolean", "int", "long", "float", "double")
# Avro's and Protobuf's rule for a field or record name (JSON Schema would take any).
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEQ_MAP = re.compile(r"seq\(map\(\w+,\s*tensor\((\w+)\)\)\)\Z")  # a ZipMap's: its values' element


@dataclass(frozen=True, slots=True)
class Scalar:
    kind: str  # one of SCALARS


@dataclass(frozen=True, slots=True)
class ListOf:
    items: Type


@dataclass(frozen=True, slots=True)
class MapOf:
    values: Type  # keys are strings


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: Type
    optional: bool = False  # may be absent or null


@dataclass(frozen=True, slots=True)
class Record:
    name: str
    fields: tuple[Field, ...]


Type = Scalar | ListOf | MapOf | Record

STRING, BOOLEAN, INT, LONG, FLOAT, DOUBLE = (Scalar(k) for k in SCALARS)

# The request fields every document codec reads the same way (ctr_fields.py read_meta).
META_FIELDS = (
    Field("request_id", STRING),
    Field("priority", INT, optional=True),
    Field("deadline_ms", LONG, optional=True),
    Field("tenant", STRING, optional=True),
)

# What pipeline/scoring.py result_document writes around the codec's own fields.
SOURCE = Record("Source", (Field("topic", STRING), Field("partition", INT), Field("offset", LONG)))
RESULT_FIELDS_AFTER = (
    Field("key", STRING, optional=True),
    Field("model", STRING),
    Field("model_version", STRING),
    Field("batch_rows", LONG),
    Field("queue_wait_ms", LONG),
    Field("inference_ms", DOUBLE),
    Field("kafka_ts_ms", LONG, optional=True),
    Field("scored_at_ms", LONG),
    Field("priority", INT),
    Field("late", BOOLEAN),
    Field("source", SOURCE),
    Field("tenant", STRING, optional=True),
)


def element(dtype: np.dtype) -> Scalar:
    """The scalar a tensor element of `dtype` is written as: float32 and float16 as
    float, float64 as double, integers up to 16 bits as int and wider as long, bool,
    string (object arrays)."""
    kind = dtype.kind
    if kind == "f":
        return DOUBLE if dtype.itemsize == 8 else FLOAT
    if kind in "iu":
        return INT if dtype.itemsize < 4 or (kind == "i" and dtype.itemsize == 4) else LONG
    if kind == "b":
        return BOOLEAN
    if kind == "O":
        return STRING
    raise ValueError(f"no schema type for elements of dtype {dtype}")


def result_types(outputs: Sequence[Any]) -> tuple[dict[str, Type], dict[str, int]]:
    """Per model output (pipeline/runtime/onnx_graph.py TensorInfo): the type of one
    element of a request's row, and the row's number of dimensions. A tensor's
    elements; a sequence of maps (a ZipMap) gives a map per row, its keys as strings."""
    types: dict[str, Type] = {}
    depth: dict[str, int] = {}
    for t in outputs:
        if t.dtype is not None and t.shape is not None:
            types[t.name], depth[t.name] = element(t.dtype), max(len(t.shape) - 1, 0)
        else:
            found = _SEQ_MAP.match(t.type)
            if found and found.group(1) in DTYPES:
                types[t.name], depth[t.name] = MapOf(element(DTYPES[found.group(1)])), 0
    return types, depth


def nested(scalar: Type, depth: int) -> Type:
    """`scalar` in `depth` levels of lists (a tensor of that many dimensions)."""
    out = scalar
    for _ in range(depth):
        out = ListOf(out)
    return out


def check_name(name: str, where: str) -> None:
    """ValueError (one line) for a field name Avro and Protobuf cannot have."""
    if not NAME.match(name):
        raise ValueError(f"{where} field {name!r} cannot name a schema field (letters, digits and _, "
                         "not starting with a digit): give it another name (a pipelines: entry's inputs:/outputs:)")


def record_name(pipeline: str, suffix: str) -> str:
    """A record name from a pipeline's name: "my-ranker" -> "MyRankerRequest"."""
    words = re.split(r"[^A-Za-z0-9]+", pipeline)
    name = "".join(w[:1].upper() + w[1:] for w in words if w) + suffix
    return name if NAME.match(name) else f"P{name}"


def result_record(name: str, codec_fields: Sequence[Field]) -> Record:
    """The whole result document: request_id, the codec's own fields, then what
    pipeline/scoring.py result_document adds (a codec field of the same name gives way)."""
    after = {f.name for f in RESULT_FIELDS_AFTER}
    own = [f for f in codec_fields if f.name != "request_id" and f.name not in after]
    return Record(name, (Field("request_id", STRING), *own, *RESULT_FIELDS_AFTER))


def sample(t: Type) -> Any:
    """A value of type `t` (zeros, empty strings, empty lists): a document any schema
    made from `t` takes, e.g. to register a writer's schema before its first record."""
    if isinstance(t, Record):
        return {f.name: None if f.optional else sample(f.type) for f in t.fields}
    if isinstance(t, ListOf):
        return []
    if isinstance(t, MapOf):
        return {}
    return {"string": "", "boolean": False, "float": 0.0, "double": 0.0}.get(t.kind, 0)


def records(t: Type) -> list[Record]:
    """Every record type inside `t`, `t` first if it is one, each once (by name)."""
    out: dict[str, Record] = {}
    stack = [t]
    while stack:
        cur = stack.pop()
        if isinstance(cur, Record):
            if cur.name in out:
                continue
            out[cur.name] = cur
            stack.extend(f.type for f in reversed(cur.fields))
        elif isinstance(cur, ListOf):
            stack.append(cur.items)
        elif isinstance(cur, MapOf):
            stack.append(cur.values)
    return list(out.values())
