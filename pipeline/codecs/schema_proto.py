"""A document type (record_types.py) as a Protobuf file and message class, and messages
to and from documents (dicts of lists and numbers, as the JSON path has them).

The message class is built at run time from a FileDescriptorProto, as protoc's generated
module does, so no protoc is needed; confluent-kafka's ProtobufSerializer registers the
file as it registers a generated one (docs/SCHEMA_REGISTRY.md, "Protobuf").

Proto3 has no nested repeated fields and no optional lists, so:
- a scalar field that may be absent is a proto3 `optional` field (absent = not set);
- a list of lists (a tensor of two or more dimensions) or a list of maps is a repeated
  *wrapper* message whose one field, named `values`, holds the inner list or map: a
  message with a single field named `values` reads as that field's value (`to_dict`).
  A producer with its own .proto writes the same shape.
- a map has string keys (a ZipMap's class labels as strings, as in the JSON result).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from pipeline.codecs.record_types import Field, ListOf, MapOf, Record, Scalar, Type

_F = descriptor_pb2.FieldDescriptorProto
_SCALAR = {"string": _F.TYPE_STRING, "boolean": _F.TYPE_BOOL, "int": _F.TYPE_INT32, "long": _F.TYPE_INT64,
           "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE}
WRAPPED = "values"  # the one field of a wrapper message


def proto_file(root: Record, package: str, file_name: str) -> descriptor_pb2.FileDescriptorProto:
    """The proto3 file of `root`: its message first, then every record and wrapper it uses."""
    fdp = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    made: dict[str, str] = {}  # record name -> full type name
    taken: set[str] = set()

    def message(rec: Record) -> str:
        if rec.name not in made:
            made[rec.name] = f".{package}.{rec.name}"
            taken.add(rec.name)
            m = fdp.message_type.add(name=rec.name)
            for number, f in enumerate(rec.fields, 1):
                add(m, f, number)
        return made[rec.name]

    def wrapper(t: Type, hint: str) -> str:
        name, n = f"{hint}Values", 1
        while name in taken:
            n += 1
            name = f"{hint}Values{n}"
        return message(Record(name, (Field(WRAPPED, t),)))

    def element(fd: Any, t: Type, hint: str) -> None:
        """Set the type of a field (or a map entry's value) that holds one `t`."""
        if isinstance(t, Scalar):
            fd.type = _SCALAR[t.kind]
        else:
            fd.type = _F.TYPE_MESSAGE
            fd.type_name = message(t) if isinstance(t, Record) else wrapper(t, hint)

    def add(m: Any, f: Field, number: int) -> None:
        fd = m.field.add(name=f.name, number=number, label=_F.LABEL_OPTIONAL)
        t, hint = f.type, camel(f.name)
        if isinstance(t, ListOf):
            fd.label = _F.LABEL_REPEATED
            element(fd, t.items, hint)
        elif isinstance(t, MapOf):
            entry = m.nested_type.add(name=f"{hint}Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
            element(entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL), t.values, hint)
            fd.label, fd.type, fd.type_name = _F.LABEL_REPEATED, _F.TYPE_MESSAGE, f"{made[m.name]}.{entry.name}"
        else:
            element(fd, t, hint)
            if f.optional and isinstance(t, Scalar):  # proto3 `optional`: a synthetic oneof of its own
                fd.proto3_optional = True
                fd.oneof_index = len(m.oneof_decl)
                m.oneof_decl.add(name=f"_{f.name}")

    message(root)
    return fdp


def message_class(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> type[Message]:
    """The class of message `name` (package-qualified) of the file `fdp`, in a pool of its own."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def camel(name: str) -> str:
    """protoc's CamelCase of a field name ("item_ids" -> "ItemIds"): a map field's entry
    message must be named so."""
    out, upper = [], True
    for ch in name:
        if ch == "_":
            upper = True
            continue
        out.append(ch.upper() if upper else ch)
        upper = False
    return "".join(out)


@functools.cache
def _is_wrapper(desc: Any) -> bool:
    fields = desc.fields
    return len(fields) == 1 and fields[0].name == WRAPPED and fields[0].is_repeated


def to_dict(msg: Message) -> dict[str, Any]:
    """A message as a document: unset optional fields left out, repeated fields as
    lists, maps as dicts, wrappers as the list or map they hold. (ListFields, the set
    fields only, is one C call: a CTR request's ~400 fields read ~4x faster than
    field by field; a field without presence that holds its default is not listed,
    and gets it from `_defaults`.)"""
    kinds, out = _layout(msg.DESCRIPTOR)
    out = dict(out)
    for fd, value in msg.ListFields():
        kind = kinds[fd.name]
        if kind == _K_SCALARS:
            out[fd.name] = list(value)
        elif kind == _K_MESSAGES:
            out[fd.name] = [_value(v) for v in value]
        elif kind == _K_MAP:
            out[fd.name] = dict(value)
        elif kind == _K_MAP_OF_MESSAGES:
            out[fd.name] = {k: _value(v) for k, v in value.items()}
        elif kind == _K_MESSAGE:
            out[fd.name] = _value(value)
        else:
            out[fd.name] = value
    return out


_K_SCALAR, _K_SCALARS, _K_MESSAGE, _K_MESSAGES, _K_MAP, _K_MAP_OF_MESSAGES = range(6)


@functools.cache
def _layout(desc: Any) -> tuple[dict[str, int], dict[str, Any]]:
    """Per message type: each field's kind, and the value of each field that is there
    even when not set (repeated ones: empty; singular scalars without presence: their
    default)."""
    kinds: dict[str, int] = {}
    defaults: dict[str, Any] = {}
    for fd in desc.fields:
        sub = fd.message_type
        if fd.is_repeated and sub is not None and sub.GetOptions().map_entry:
            kinds[fd.name] = _K_MAP if sub.fields_by_name["value"].message_type is None else _K_MAP_OF_MESSAGES
            defaults[fd.name] = {}
        elif fd.is_repeated:
            kinds[fd.name] = _K_MESSAGES if sub is not None else _K_SCALARS
            defaults[fd.name] = []
        else:
            kinds[fd.name] = _K_MESSAGE if sub is not None else _K_SCALAR
            if not fd.has_presence:
                defaults[fd.name] = fd.default_value
    return kinds, defaults


def _value(msg: Message) -> Any:
    doc = to_dict(msg)
    return doc[WRAPPED] if _is_wrapper(msg.DESCRIPTOR) else doc


def fill(msg: Message, doc: Mapping[str, Any]) -> Message:
    """Set `msg`'s fields from a document (the inverse of to_dict): a field absent or
    null stays unset, keys the message has no field for are ignored (as Avro's writer
    ignores them). Returns `msg`."""
    for fd in msg.DESCRIPTOR.fields:
        value = doc.get(fd.name)
        if value is None:
            continue
        sub = fd.message_type
        target = getattr(msg, fd.name)
        if fd.is_repeated and sub is not None and sub.GetOptions().map_entry:
            if sub.fields_by_name["value"].message_type is None:
                target.update(value)
            else:
                for k, v in value.items():
                    _fill_value(target[k], v)
        elif fd.is_repeated and sub is not None:
            for v in value:
                _fill_value(target.add(), v)
        elif fd.is_repeated:
            target.extend(value)
        elif sub is not None:
            _fill_value(target, value)
        else:
            setattr(msg, fd.name, value)
    return msg


def _fill_value(msg: Message, value: Any) -> None:
    fill(msg, {WRAPPED: value} if _is_wrapper(msg.DESCRIPTOR) else value)
