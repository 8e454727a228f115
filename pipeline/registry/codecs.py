"""Codecs by name: the one table a `pipelines:` entry's `codec:` is looked up in, for
the shipped pipelines (models/pipelines.yaml) and a user's alike (docs/OWN_MODEL.md).

- `tensor-json`, `tensor-binary`: the generic codecs, built from the model's graph
  (pipeline/codecs/tensor_json.py), configured by the entry's inputs/outputs/rows/pad;
  `avro`, `protobuf`, `jsonschema`: the same requests and results as schema-registry
  records (pipeline/codecs/schema_wire.py, docs/SCHEMA_REGISTRY.md);
- the built-in codec classes (`ctr`, `camera`, `text`) and the classes installed
  packages name under the `tidebatch.codecs` entry-point group, one table of
  name -> EntryPoint (`installed_codecs`);
- or "package.module:Class".

A codec class is constructed with keyword options (`make_codec`), checked against its
signature so that a typo fails at start naming the key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipeline.errors import UserError

if TYPE_CHECKING:
    from pipeline.codecs.base import Codec

# tensor-json's requests and results as schema-registry records (the config's
# `schema_registry:` section names the registry): pipeline/registry/schema_settings.py
SCHEMA_CODECS = ("avro", "protobuf", "jsonschema")
GRAPH_CODECS = ("tensor-json", "tensor-binary", *SCHEMA_CODECS)  # tensor-binary: the same requests as msgpack
# A package can name its codec classes under this entry-point group (pyproject.toml:
# [project.entry-points."tidebatch.codecs"] my-codec = "my_pkg.codecs:MyCodec"); an
# entry then says `codec: my-codec` (docs/OWN_MODEL.md, "A codec class of your own").
ENTRY_POINTS = "tidebatch.codecs"
# The codec classes that ship, found exactly as an installed package's are: entry points
# of the same group, listed here rather than in pyproject.toml so that they are there
# whether or not the checkout is pip-installed (the tests run it from PYTHONPATH).
BUILTIN_CODECS = {
    "ctr": "pipeline.codecs.ctr:CtrCodec",
    "camera": "pipeline.codecs.camera:CameraCodec",
    "text": "pipeline.codecs.text:TextCodec",
}
CLASS_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
PROTOCOL = ("decode", "collate", "split")  # pipeline/codecs/base.py, Codec


def installed_codecs() -> dict[str, Any]:
    """The codec classes by name: the built-in ones, then those installed packages name
    under ENTRY_POINTS (a built-in name cannot be taken over): name -> EntryPoint."""
    from importlib.metadata import EntryPoint, entry_points

    table = {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}
    table.update({name: EntryPoint(name, value, ENTRY_POINTS) for name, value in BUILTIN_CODECS.items()})
    return table


def known_codec(name: str) -> bool:
    return name in GRAPH_CODECS or name in BUILTIN_CODECS or bool(CLASS_SPEC.match(name)) or name in installed_codecs()


def unknown_codec_reason(name: str) -> str:
    others = sorted(n for n in installed_codecs() if n not in BUILTIN_CODECS)
    return (
        f"{name!r} is not one of {', '.join((*GRAPH_CODECS, *BUILTIN_CODECS))}, nor a class as 'package.module:Class', "
        f"nor a codec installed under the {ENTRY_POINTS!r} entry points ({', '.join(others) or 'none installed'})"
    )


def codec_type(pipeline: str, spec: str) -> tuple[type, str]:
    """The class "package.module:Class" or a codec name of the table names, and the
    words that name it in an error; UserError (one line) when it cannot be imported."""
    import importlib

    where = f"pipeline {pipeline!r}: codec {spec}"
    try:
        if CLASS_SPEC.match(spec):
            module, _, attr = spec.partition(":")
            return getattr(importlib.import_module(module), attr), where
        point = installed_codecs()[spec]
        if spec not in BUILTIN_CODECS:
            where = f"{where} ({point.value}, entry point of {point.dist.name if point.dist else 'a package'})"
        return point.load(), where
    except (ImportError, AttributeError, KeyError) as exc:
        raise UserError(f"{where}: cannot import it: {type(exc).__name__}: {exc}") from None


def make_codec(pipeline: str, spec: str, options: Mapping[str, Any],
               config_options: Mapping[str, Any] | None = None, max_items: int | None = None) -> Codec:
    """An instance of codec `spec` with the entry's `options` (codec_options) and, over
    them, the worker config's `codec:` section (`config_options`); a class that takes
    `max_items` and is given none gets the worker's `max_items`. Each option is checked
    against the class's arguments, naming its key; UserError (one line) when the class
    cannot be made or lacks a method of the Codec protocol."""
    import inspect

    cls, where = codec_type(pipeline, spec)
    try:
        known = [n for n in inspect.signature(cls).parameters if n != "self"]
    except (TypeError, ValueError):
        known = []
    config_options = config_options or {}
    for source, given in (("codec_options", options), ("config key 'codec", config_options)):
        unknown = [k for k in given if k not in known]
        if unknown:
            key = f"{source}.{unknown[0]}" + ("'" if source.startswith("config") else "")
            raise UserError(f"{where}: {key} is not one of its arguments ({', '.join(known) or 'none'})")
    merged = {**options, **config_options}
    if max_items is not None and "max_items" in known and "max_items" not in merged:
        merged["max_items"] = max_items
    try:
        codec = cls(**merged)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None
    missing = [m for m in PROTOCOL if not callable(getattr(codec, m, None))]
    if missing:
        raise UserError(f"{where}: not a codec: it has no {', '.join(missing)} (pipeline/codecs/base.py, Codec)")
    return codec
