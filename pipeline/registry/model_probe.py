"""Runs a model once on a small batch of sample requests, for `tidebatch inspect`
(pipeline/registry/inspect_model.py): which outputs really give one row per request, and the
result fields the first request gets.

Why run it rather than read the declared shapes: exporters declare output shapes
wrongly in both directions. onnxmltools declares a LightGBM classifier's `label` as
[1] while it gives one label per row, and a sequence (a ZipMap's list of
{class: probability} maps) has no declared length at all. The batching verdict and the
starter config's `outputs:` are only right if they follow what the model does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from pipeline.runtime.onnx_graph import GraphInfo

PROBE_ROWS = 3  # not 1 or 2: a fixed dimension of that size would pass for a batch


@dataclass(frozen=True, slots=True)
class Probe:
    rows: int  # requests in the batch it ran
    gave: dict[str, str]  # output -> what it gave for the batch: "3 rows", "a scalar", "a dict"
    per_request: tuple[str, ...]  # the outputs that gave one row per request, in graph order
    result: dict[str, Any]  # the first request's result fields (tensor-json's split), JSON-ready
    error: str | None = None  # the model refused the batch: why (one line)


def probe(graph: GraphInfo, requests: Sequence[Mapping[str, Any]]) -> Probe:
    """Decode `requests` (tensor-json documents, one field per input by its own name)
    with the tensor-json codec, run them as one batch on ONNX Runtime (CPU), and see
    what every output gave. The model's errors are reported, not raised."""
    from pipeline.codecs.tensor_json import TensorJsonCodec
    from pipeline.extras import onnxruntime

    ort = onnxruntime()  # a missing ONNX Runtime is one line naming the extra

    n = len(requests)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # a wrongly declared output shape warns on every run
    try:
        codec = TensorJsonCodec(graph.inputs, ())  # decode and collate only; outputs are mapped below
        decoded = [codec.decode(orjson.dumps(doc), None) for doc in requests]
        session = ort.InferenceSession(str(graph.path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, codec.collate([d.payload for d in decoded])), strict=True))
    except Exception as exc:  # ORT raises its own classes for shape, type and kernel failures; the codec ValueError
        text = str(exc).strip()
        return Probe(n, {}, (), {}, text.splitlines()[-1] if text else type(exc).__name__)
    gave = {name: _gave(value) for name, value in outputs.items()}
    kinds = {t.name: t.type for t in graph.outputs}
    # rows of a tensor or a sequence of maps (a ZipMap's) are what tensor-json's split hands out
    per_request = tuple(name for name in names if gave[name] == f"{n} rows"
                        and kinds[name].startswith(("tensor(", "seq(map(")))
    codec.results = {name: name for name in per_request}
    result = codec.split({name: outputs[name] for name in per_request}, decoded[:1])[0]
    return Probe(n, gave, per_request, result)


def _gave(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape == ():
        return "a scalar"
    if shape is not None or isinstance(value, list):
        n = shape[0] if shape is not None else len(value)
        return f"{n} row" if n == 1 else f"{n} rows"
    return f"a {type(value).__name__}"
