"""The JSON Schema of the worker's YAML config, made from the dataclasses in
pipeline/config/sections.py, so it cannot drift from what the worker reads. Editors (the YAML
language server's `# yaml-language-server: $schema=...`) and CI checks use it;
`tidebatch config schema` prints it and docs/schemas/worker-config.schema.json holds
a copy (tests/unit/test_config_schema.py fails when the copy is stale).

The schema checks shape and types; what a schema cannot say (a policy name, a TCP
port, both-or-neither keys) stays in the worker's own validation, which
`tidebatch config check FILE` runs too.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


def config_schema(root: type) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the dataclass `root` as YAML."""
    schema = _object(root)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tidebatch worker configuration",
        **schema,
    }


def _object(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        prop = _type(hints[f.name])
        default = _default(f)
        if default is not dataclasses.MISSING:
            prop["default"] = default
        properties[f.name] = prop
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if dataclasses.is_dataclass(value):
        return dataclasses.MISSING  # a section: its keys carry their own defaults
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    return list(value) if isinstance(value, tuple) else value


def _type(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type(a) for a in args]}
    if tp is type(None):
        return {"type": "null"}
    if dataclasses.is_dataclass(tp):
        return _object(tp)
    if origin is dict:
        key, value = args
        # YAML keys of a dict[int, ...] (priority levels) arrive as integers; JSON
        # Schema sees every key as a string, so the pattern says "digits".
        out: dict[str, Any] = {"type": "object", "additionalProperties": _type(value)}
        if key is int:
            out["propertyNames"] = {"pattern": "^-?[0-9]+$"}
        return out
    if origin in (list, tuple):
        return {"type": "array", "items": _type(args[0]) if args else {}}
    if tp is Any:
        return {}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no JSON Schema for {tp!r}")
