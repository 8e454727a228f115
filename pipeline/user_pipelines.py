"""Pipelines defined in the worker's configuration: an ONNX file, the generic
`tensor-json` codec (pipeline/codecs/tensor_json.py), topics and batching, with no
code (docs/OWN_MODEL.md). `get_pipeline` (pipeline/pipelines.py) turns an entry into
the same PipelineSpec the shipped pipelines have, so the worker, its warm-up, limits,
metrics and dead letters treat both alike.

    pipeline: my-ranker
    pipelines:
      - name: my-ranker
        model: models/my-ranker.onnx   # relative to the working directory
        codec: tensor-json
        inputs: {features: dense, token_ids: tokens}   # request field -> model input
        outputs: {score: prob}                         # result field -> model output

This module checks an entry's keys and types when the configuration loads (the error
names the key, as pipeline/config.py does); what needs the model (do the inputs exist,
is the batch dimension dynamic) is checked when the worker builds the codec.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import UserError

if TYPE_CHECKING:
    from models.registry import ModelSpec
    from pipeline.codecs.base import Codec
    from pipeline.codecs.tensor_json import InputField

CODECS = ("tensor-json", "tensor-binary")  # tensor-binary: the same requests as msgpack
# A package can name its codec classes under this entry-point group (pyproject.toml:
# [project.entry-points."tidebatch.codecs"] my-codec = "my_pkg.codecs:MyCodec"); an
# entry then says `codec: my-codec` (docs/OWN_MODEL.md, "A codec class of your own").
ENTRY_POINTS = "tidebatch.codecs"
# Or a codec class of the user's own, "package.module:Class" (the Codec protocol,
# pipeline/codecs/base.py), constructed with the entry's codec_options.
_CLASS = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")  # also a topic-name prefix
# key -> (accepted types, what the error says)
_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "string"),
    "model": ((str,), "string (path to an .onnx file)"),
    "codec": ((str,), "string"),
    "version": ((str, int), "string"),
    "input_topic": ((str,), "string"),
    "output_topic": ((str,), "string"),
    "inputs": ((dict,), "mapping of request field -> model input"),
    "outputs": ((dict,), "mapping of result field -> model output"),
    "rows": ((str,), "one or many"),
    "max_rows": ((int,), "int"),
    "max_batch_rows": ((int,), "int"),
    "max_request_bytes": ((int,), "int"),
    "sample_dims": ((dict,), "mapping of dimension name -> size"),
    "samples": ((str,), "string (path to a file of requests, one per line)"),
    "codec_options": ((dict,), "mapping of keyword arguments of the codec class"),
    # ragged sequences padded to bucket edges, the mask filled (pipeline/codecs/tensor_pad.py)
    "pad": ((dict,), "mapping with dimension, buckets, mask, value"),
}


def validate_pipelines(cfg: Any, bad: Callable[[str, str], UserError], shipped: Collection[str]) -> None:
    """The `pipelines` entries' keys and types, their names unique and not among the
    `shipped` ones, and `pipeline` naming a shipped or a defined pipeline."""
    seen: set[str] = set()
    for i, entry in enumerate(cfg.pipelines):
        key = f"pipelines[{i}]"
        if not isinstance(entry, dict):
            raise bad(key, f"expected a mapping, got {type(entry).__name__}")
        for k, v in entry.items():
            if k not in _KEYS:
                raise bad(f"{key}.{k}", f"is not known; use {', '.join(_KEYS)}")
            types, what = _KEYS[k]
            if isinstance(v, bool) or not isinstance(v, types):
                raise bad(f"{key}.{k}", f"expected {what}, got {v!r}")
        for k in ("name", "model"):
            if k not in entry:
                raise bad(f"{key}.{k}", "is required")
        name = entry["name"]
        if not _NAME.match(name):
            raise bad(f"{key}.name", f"{name!r} must be letters, digits, '_', '.', '-' (it prefixes topic names)")
        if name in shipped:
            raise bad(f"{key}.name", f"{name!r} is a shipped pipeline; pick another name")
        if name in seen:
            raise bad(f"{key}.name", f"{name!r} is defined twice")
        seen.add(name)
        codec = entry.get("codec", "tensor-json")
        if codec not in CODECS and not _CLASS.match(codec) and codec not in installed_codecs():
            raise bad(f"{key}.codec", (
                f"{codec!r} is not one of {', '.join(CODECS)}, nor a class as 'package.module:Class', nor a codec "
                f"installed under the {ENTRY_POINTS!r} entry points ({', '.join(sorted(installed_codecs())) or 'none installed'})"
            ))
        if "codec_options" in entry and codec in CODECS:
            raise bad(f"{key}.codec_options", f"only for a codec class of your own; {codec} takes inputs, outputs, rows")
        if "pad" in entry and codec not in CODECS:
            raise bad(f"{key}.pad", "is a tensor-json setting; a codec class of your own pads as it likes")
        if entry.get("rows", "one") not in ("one", "many"):
            raise bad(f"{key}.rows", f"{entry['rows']!r} is not one of one, many")
        for k in ("max_rows", "max_batch_rows"):
            if entry.get(k, 1) < 1:
                raise bad(f"{key}.{k}", "must be >= 1")
        if entry.get("max_request_bytes", 1024) < 1024:
            raise bad(f"{key}.max_request_bytes", "must be >= 1024")
        for k in ("inputs", "outputs", "sample_dims"):
            for field, target in (entry.get(k) or {}).items():
                want = int if k == "sample_dims" else str
                if not isinstance(field, str) or isinstance(target, bool) or not isinstance(target, want):
                    raise bad(f"{key}.{k}.{field}", f"expected {want.__name__}, got {target!r}")
    if cfg.pipeline not in shipped and cfg.pipeline not in seen:
        defined = f"; defined under pipelines: {', '.join(sorted(seen))}" if seen else ""
        raise bad("pipeline", f"unknown pipeline {cfg.pipeline!r}; shipped pipelines: {', '.join(sorted(shipped))}{defined}")


def served_version(name: str, source: Path, version: str) -> tuple[Path, str]:
    """The file to serve at start and its version: `source` itself, or the newest
    version folder of a model repository (pipeline/versions/repository.py)."""
    from pipeline.versions.repository import is_repository, scan

    if not is_repository(source):
        return source, version
    found = scan(source)
    if not found:
        raise UserError(f"pipeline {name!r}: no version folder with a model.onnx under {source} (e.g. {source}/1/model.onnx)")
    newest = found[-1]
    return newest.path, str(newest.version)


class UserPipeline:
    """One `pipelines` entry (checked by validate_pipelines): what its PipelineSpec
    calls. The graph is read once, on first use."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.entry = dict(entry)
        self.name = str(entry["name"])
        self.input_topic = str(entry.get("input_topic") or f"{self.name}.requests")
        self.output_topic = str(entry.get("output_topic") or f"{self.name}.results")
        self._model: ModelSpec | None = None
        self._codec: Codec | None = None

    def load_model(self) -> ModelSpec:
        from models.registry import ModelSpec
        from pipeline.onnx_graph import read_graph

        if self._model is None:
            source = Path(self.entry["model"])
            path, version = served_version(self.name, source, str(self.entry.get("version", "1")))
            graph = read_graph(path)
            describe = [{"name": t.name, "dtype": t.type, "shape": list(t.shape or ())} for t in graph.inputs]
            results = [{"name": t.name, "dtype": t.type, "shape": list(t.shape or ())} for t in graph.outputs]
            self._model = ModelSpec(
                name=self.name, version=version, onnx_path=graph.path,
                inputs=describe, outputs=results, raw={**self.entry, "graph": graph}, source=source,
            )
        return self._model

    def make_codec(self, cfg: Any = None) -> Codec:
        from pipeline.codecs.tensor_binary import TensorBinaryCodec
        from pipeline.codecs.tensor_json import TensorJsonCodec

        if self._codec is None and self.entry.get("codec", "tensor-json") not in CODECS:
            self._check_wire(cfg)
            self._codec = codec_class(self.name, self.entry["codec"], self.entry.get("codec_options") or {})
        if self._codec is None:
            graph = self.load_model().raw["graph"]
            self._check_wire(cfg)
            cls = TensorBinaryCodec if self.entry.get("codec") == "tensor-binary" else TensorJsonCodec
            try:
                self._codec = cls(
                    graph.inputs, graph.outputs, self.entry.get("inputs"), self.entry.get("outputs"),
                    rows=self.entry.get("rows", "one"), max_rows=self.entry.get("max_rows", 1000),
                    pad=self.entry.get("pad"),
                )
            except ValueError as exc:
                raise UserError(f"pipeline {self.name!r} ({graph.path.name}): {exc}") from None
        return self._codec

    def _check_wire(self, cfg: Any) -> None:
        """With runtime.model_process, every input and output must be of a type the
        model process's wire carries (pipeline/runtime/wire_values.py), whatever the
        codec: refused at start with one line, not per batch."""
        from pipeline.runtime.wire_values import carried

        runtime = getattr(cfg, "runtime", None)
        if runtime is None or not runtime.model_process:
            return
        graph = self.load_model().raw["graph"]
        odd = [t for t in (*graph.inputs, *graph.outputs) if not carried(t.type)]
        if odd:
            raise UserError(f"pipeline {self.name!r}: {odd[0].name!r} is a {odd[0].type}, which runtime.model_process "
                            "cannot carry; set runtime.model_process: false")

    def make_samples(self, seed: int) -> Callable[[int], tuple[bytes | None, bytes, list[tuple[str, bytes]]]]:
        """Valid requests for the warm-up profile and `tidebatch produce`: the lines of
        the entry's `samples` file, round robin; else a codec class's own
        `sample_request(i) -> bytes`; else, for tensor-json, random values: floats from
        N(0, 1), integers 0 (an index every embedding has), booleans false, strings
        empty, an input named like a mask all ones, a dynamic dimension of size
        sample_dims[name] (default 8)."""
        from pipeline.codecs.tensor_json import TensorJsonCodec

        codec = self.make_codec()
        if self.entry.get("samples"):
            path = Path(self.entry["samples"])
            lines = request_lines(path, f"pipeline {self.name!r}: samples file {path}")
            if self.entry.get("codec") == "tensor-binary":  # lines are JSON; sent in the codec's form
                lines = [json_line_as(codec, line, f"pipeline {self.name!r}: samples file {path}") for line in lines]
            return lambda i: (None, lines[i % len(lines)], [])
        if not isinstance(codec, TensorJsonCodec):
            own = getattr(codec, "sample_request", None)
            if own is None:
                raise UserError(f"pipeline {self.name!r}: codec {self.entry['codec']} has no sample_request(i) and "
                                "the entry no `samples` file: the warm-up needs valid requests")
            return lambda i: (None, bytes(own(i)), [])
        dims = dict(self.entry.get("sample_dims") or {})
        rng = np.random.default_rng(seed)

        def make(i: int) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
            rid = f"{self.name}-{seed}-{i}"
            doc = {"request_id": rid, **sample_fields(codec.fields, codec.many, rng, dims)}
            return rid.encode(), codec.encode(doc), []

        return make


def installed_codecs() -> dict[str, Any]:
    """The codec classes installed packages name under ENTRY_POINTS: name -> EntryPoint."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS)}


def codec_class(pipeline: str, spec: str, options: Mapping[str, Any]) -> Codec:
    """An instance of "package.module:Class", or of an installed entry point's class,
    with `options`; UserError (one line) when it cannot be imported or made, or lacks
    a method of the Codec protocol."""
    import importlib
    import inspect

    where = f"pipeline {pipeline!r}: codec {spec}"
    try:
        if _CLASS.match(spec):
            module, _, attr = spec.partition(":")
            cls = getattr(importlib.import_module(module), attr)
        else:
            point = installed_codecs()[spec]
            where = f"{where} ({point.value}, entry point of {point.dist.name if point.dist else 'a package'})"
            cls = point.load()
    except (ImportError, AttributeError, KeyError) as exc:
        raise UserError(f"{where}: cannot import it: {type(exc).__name__}: {exc}") from None
    try:
        known = [n for n in inspect.signature(cls).parameters if n != "self"]
    except (TypeError, ValueError):
        known = []
    unknown = [k for k in options if k not in known]
    if unknown:
        raise UserError(f"{where}: codec_options.{unknown[0]} is not one of its arguments ({', '.join(known) or 'none'})")
    try:
        codec = cls(**options)
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: {exc}") from None
    missing = [m for m in ("decode", "collate", "split") if not callable(getattr(codec, m, None))]
    if missing:
        raise UserError(f"{where}: not a codec: it has no {', '.join(missing)} (pipeline/codecs/base.py, Codec)")
    return codec


def request_lines(path: Path, what: str) -> list[bytes]:
    """The non-blank lines of a file of requests (a `samples` file, `produce --file`),
    each one request value; `what` names the file in the one-line error."""
    try:
        lines = [line.strip() for line in path.read_bytes().splitlines() if line.strip()]
    except OSError as exc:
        raise UserError(f"{what}: {exc.strerror or exc}") from None
    if not lines:
        raise UserError(f"{what}: no requests in it")
    return lines


def json_line_as(codec: Any, line: bytes, what: str) -> bytes:
    """A JSON request line in the form of `codec` (its `encode`); UserError naming the
    file when the line is not a JSON object."""
    import orjson

    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{what}: a line is not JSON: {exc}") from None
    if type(doc) is not dict:
        raise UserError(f"{what}: a line is not a JSON object")
    return codec.encode(doc)


def sample_fields(
    fields: Sequence[InputField], many: bool, rng: np.random.Generator, dims: Mapping[str, int]
) -> dict[str, Any]:
    """One valid request's model fields (see UserPipeline.make_samples); with `many`,
    two rows."""
    lead = (2,) if many else ()
    out: dict[str, Any] = {}
    for f in fields:
        shape = lead + tuple(d if isinstance(d, int) else int(dims.get(d, 8)) for d in f.dims)
        if "mask" in f.name.lower() and f.dtype.kind in "biuf":
            # every position real: an all-zero attention mask makes a masked mean 0/0
            out[f.field] = np.ones(shape, dtype=f.dtype).tolist()
        elif f.dtype.kind == "f":
            out[f.field] = np.round(rng.standard_normal(shape), 4).tolist()
        elif f.dtype.kind == "b":
            out[f.field] = np.zeros(shape, dtype=bool).tolist()
        elif f.dtype.kind == "O":
            out[f.field] = np.full(shape, "", dtype=object).tolist()
        else:
            out[f.field] = np.zeros(shape, dtype=np.int64).tolist()
    return out
