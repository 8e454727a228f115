"""Pipelines as `pipelines:` entries: a model (an ONNX file, a folder of version
folders, or a spec.json), a codec by name, topics, batching and limits, with no code
(docs/OWN_MODEL.md). The shipped CTR, camera and text pipelines are such entries too
(models/pipelines.yaml); `get_pipeline` (pipeline/registry/pipelines.py) turns every entry into
a PipelineSpec through EntryPipeline, so the worker, its warm-up, limits, metrics and
dead letters treat them all alike.

    pipeline: my-ranker
    pipelines:
      - name: my-ranker
        model: models/my-ranker.onnx   # relative to the working directory
        codec: tensor-json
        inputs: {features: dense, token_ids: tokens}   # request field -> model input
        outputs: {score: prob}                         # result field -> model output

The keys are checked when the configuration loads (pipeline/registry/keys.py); what
needs the model (do the inputs exist, is the batch dimension dynamic) is checked here,
when the worker builds the codec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import UserError

if TYPE_CHECKING:
    from models.registry import ModelSpec
    from pipeline.codecs.base import Codec, Sample
    from pipeline.codecs.tensor_json import InputField
    from pipeline.runtime.onnx_graph import GraphInfo


def served_version(name: str, source: Path, version: str) -> tuple[Path, str]:
    """The file to serve at start and its version: `source` itself, or the newest
    version folder of a model repository (pipeline/registry/version_folders.py)."""
    from pipeline.registry.version_folders import is_repository, scan

    if not is_repository(source):
        return source, version
    found = scan(source)
    if not found:
        raise UserError(f"pipeline {name!r}: no version folder with a model.onnx under {source} (e.g. {source}/1/model.onnx)")
    newest = found[-1]
    return newest.path, str(newest.version)


class EntryPipeline:
    """One `pipelines` entry (checked by pipeline/registry/keys.py), a user's or a
    shipped one (models/pipelines.yaml): what its PipelineSpec calls. The model is
    read once, on first use; a codec is made per call, as the config asks."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.entry = dict(entry)
        self.name = str(entry["name"])
        self.codec_name = str(entry.get("codec", "tensor-json"))
        self.input_topic = str(entry.get("input_topic") or f"{self.name}.requests")
        self.output_topic = str(entry.get("output_topic") or f"{self.name}.results")
        self._model: ModelSpec | None = None
        self._graph: GraphInfo | None = None

    def load_model(self) -> ModelSpec:
        """The entry's model: a spec.json (models/registry.py: its own name, version
        and build-on-first-use), else an ONNX file or a folder of version folders,
        named after the pipeline."""
        from models.registry import ModelSpec, load_spec_file
        from pipeline.runtime.onnx_graph import read_graph

        if self._model is None:
            source = Path(self.entry["model"])
            if source.suffix == ".json":
                self._model = load_spec_file(source)
                return self._model
            path, version = served_version(self.name, source, str(self.entry.get("version", "1")))
            self._graph = read_graph(path)
            describe = [{"name": t.name, "dtype": t.type, "shape": list(t.shape or ())} for t in self._graph.inputs]
            results = [{"name": t.name, "dtype": t.type, "shape": list(t.shape or ())} for t in self._graph.outputs]
            self._model = ModelSpec(
                name=self.name, version=version, onnx_path=self._graph.path,
                inputs=describe, outputs=results, raw={**self.entry, "graph": self._graph}, source=source,
            )
        return self._model

    def graph(self) -> GraphInfo:
        """What the model's ONNX file says about its inputs and outputs (read once)."""
        from pipeline.runtime.onnx_graph import read_graph

        if self._graph is None:
            self._graph = read_graph(self.load_model().onnx_path)
        return self._graph

    def make_codec(self, cfg: Any = None) -> Codec:
        """The entry's codec (pipeline/registry/codecs.py); a codec class gets the entry's
        codec_options and, over them, the worker config's `codec:` and `max_items`. A
        pipeline that reads schema-registry records (the entry's codec avro, protobuf or
        jsonschema, or the config's schema_registry.format) gets its document codec
        behind that wire format (pipeline/registry/schema_settings.py)."""
        from pipeline.registry.schema_settings import records_format, schema_codec

        inner = self.document_codec(cfg)
        settings = getattr(cfg, "schema_registry", None)
        fmt = records_format(self.codec_name, settings)
        if fmt is None:
            return inner
        output_topic = getattr(cfg, "output_topic", None) or self.output_topic
        return schema_codec(self.name, fmt, inner, settings, output_topic)

    def document_codec(self, cfg: Any = None) -> Codec:
        """The codec of the entry's requests as documents: its own, or, for the codecs
        avro, protobuf and jsonschema, tensor-json (the fields those records carry)."""
        from pipeline.codecs.tensor_binary import TensorBinaryCodec
        from pipeline.codecs.tensor_json import TensorJsonCodec
        from pipeline.registry.codecs import GRAPH_CODECS, make_codec

        self._check_wire(cfg)
        config_options = dict(getattr(cfg, "codec", None) or {})
        if self.codec_name not in GRAPH_CODECS:
            return make_codec(self.name, self.codec_name, self.entry.get("codec_options") or {}, config_options,
                              getattr(cfg, "max_items", None))
        graph = self.graph()
        if config_options:
            raise UserError(f"config key 'codec.{next(iter(config_options))}': pipeline {self.name!r}'s codec "
                            f"{self.codec_name} takes no options; its entry's inputs, outputs, rows, pad set it")
        cls = TensorBinaryCodec if self.codec_name == "tensor-binary" else TensorJsonCodec
        try:
            return cls(
                graph.inputs, graph.outputs, self.entry.get("inputs"), self.entry.get("outputs"),
                rows=self.entry.get("rows", "one"), max_rows=self.entry.get("max_rows", 1000),
                pad=self.entry.get("pad"),
            )
        except ValueError as exc:
            raise UserError(f"pipeline {self.name!r} ({graph.path.name}): {exc}") from None

    def _check_wire(self, cfg: Any) -> None:
        """With runtime.model_process, every input and output must be of a type the
        model process's wire carries (pipeline/runtime/wire_values.py), whatever the
        codec: refused at start with one line, not per batch."""
        from pipeline.runtime.wire_values import carried

        runtime = getattr(cfg, "runtime", None)
        if runtime is None or not runtime.model_process or self.entry["model"].endswith(".json"):
            return  # a spec.json declares tensors only (models/registry.py): no session opened here to read it
        graph = self.graph()
        odd = [t for t in (*graph.inputs, *graph.outputs) if not carried(t.type)]
        if odd:
            raise UserError(f"pipeline {self.name!r}: {odd[0].name!r} is a {odd[0].type}, which runtime.model_process "
                            "cannot carry; set runtime.model_process: false")

    def make_samples(self, seed: int) -> Callable[[int], Sample]:
        """Valid requests for the warm-up profile, `tidebatch profile` and `tidebatch
        produce`: the lines of the entry's `samples` file, round robin; else the
        codec's own `samples(seed)` (the Codec protocol's optional sample maker: the
        shipped codecs' load generators) or `sample_request(i) -> bytes`; else, for
        tensor-json, random values from the graph: floats from N(0, 1), integers 0 (an
        index every embedding has), booleans false, strings empty, an input named like
        a mask all ones, a dynamic dimension of size sample_dims[name] (default 8)."""
        from pipeline.codecs.tensor_json import TensorJsonCodec

        codec = self.document_codec()  # a schema-registry pipeline's samples are its documents, as JSON
        if self.entry.get("samples"):
            path = Path(self.entry["samples"])
            lines = request_lines(path, f"pipeline {self.name!r}: samples file {path}")
            if self.codec_name == "tensor-binary":  # lines are JSON; sent in the codec's form
                lines = [json_line_as(codec, line, f"pipeline {self.name!r}: samples file {path}") for line in lines]
            return lambda i: (None, lines[i % len(lines)], [])
        maker = getattr(codec, "samples", None)
        if callable(maker):
            return maker(seed)
        if not isinstance(codec, TensorJsonCodec):
            own = getattr(codec, "sample_request", None)
            if own is None:
                raise UserError(f"pipeline {self.name!r}: codec {self.codec_name} has no samples(seed) or "
                                "sample_request(i), and the entry no `samples` file: the warm-up needs valid requests")
            return lambda i: (None, bytes(own(i)), [])
        dims = dict(self.entry.get("sample_dims") or {})
        rng = np.random.default_rng(seed)

        def make(i: int) -> Sample:
            rid = f"{self.name}-{seed}-{i}"
            doc = {"request_id": rid, **sample_fields(codec.fields, codec.many, rng, dims)}
            return rid.encode(), codec.encode(doc), []

        return make


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
    """One valid request's model fields (see EntryPipeline.make_samples); with `many`,
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
