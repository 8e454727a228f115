"""The report of `tidebatch inspect MODEL.onnx` (pipeline/commands/inspect.py): what the
graph takes and gives, whether tidebatch can batch it (and the fix when it cannot), a
sample `tensor-json` request and a starter config (docs/OWN_MODEL.md). Pure: a
GraphInfo (pipeline/runtime/onnx_graph.py) in, text out."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import orjson
import yaml

from consumers.profiles import PROFILES
from pipeline.codecs.tensor_json import InputField
from pipeline.registry.model_probe import Probe
from pipeline.registry.user_pipelines import sample_fields
from pipeline.runtime.onnx_graph import GraphInfo, TensorInfo

SAMPLE_DIM = 3  # size of a dynamic non-batch dimension in the sample request
MAX_SAMPLE_CHARS = 4000  # a larger sample (an image) is described, not printed
PAD_BUCKETS = (16, 32, 64, 128)  # suggested; as the text pipeline's buckets (pipeline/codecs/text.py)


def batching_problems(graph: GraphInfo) -> list[str]:
    """Why requests cannot share a batch: one line per input that has no dynamic
    dimension 0 (empty: batching is possible)."""
    problems = []
    for t in graph.inputs:
        if t.shape is None or t.dtype is None:
            problems.append(f"input {t.name!r} is a {t.type}, not a tensor: tensor-json cannot fill it")
        elif not t.shape:
            problems.append(f"input {t.name!r} is a scalar: it has no batch dimension")
        elif isinstance(t.shape[0], int):
            problems.append(f"input {t.name!r} has a fixed batch dimension of {t.shape[0]} (shape {t.shape_text()})")
    return problems


def fix_text(graph: GraphInfo, file_name: str) -> str:
    """How to make dimension 0 of every input and output dynamic with onnx's own tool
    (only names change; a graph that reshapes to a fixed 1 inside needs a re-export)."""

    def dims(t: TensorInfo) -> list[int | str]:
        shape = list(t.shape or ())
        return ["batch", *shape[1:]] if shape else shape

    ins = {t.name: dims(t) for t in graph.inputs if t.shape is not None}
    outs = {t.name: dims(t) for t in graph.outputs if t.shape is not None}
    out_file = re.sub(r"(\.onnx)?$", "_batch.onnx", file_name, count=1)
    return (
        "python -c \"import onnx; from onnx.tools.update_model_dims import update_inputs_outputs_dims as u; "
        f"m = u(onnx.load('{file_name}'), {ins!r}, {outs!r}); onnx.checker.check_model(m); onnx.save(m, '{out_file}')\"\n"
        "  (a graph that reshapes to a fixed batch of 1 inside needs a re-export instead, e.g. torch.onnx.export(..., "
        "dynamic_axes={'<input>': {0: 'batch'}}))"
    )


def pipeline_name(graph: GraphInfo) -> str:
    """A pipeline name from the file name: letters, digits, '_', '.', '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", graph.path.stem).strip("-.") or "my-model"


def sample_request(graph: GraphInfo, name: str, seed: int = 0) -> dict:
    fields = [InputField(t.name, t.name, t.dtype, t.shape[1:]) for t in graph.inputs
              if t.dtype is not None and t.shape]
    dims = {d: SAMPLE_DIM for f in fields for d in f.dims if isinstance(d, str)}
    return {"request_id": f"{name}-{seed + 1}", **sample_fields(fields, False, np.random.default_rng(seed), dims)}


def per_request_outputs(graph: GraphInfo, probe: Probe | None) -> list[str]:
    """The outputs a result can carry: those that gave one row per request when the
    model ran (pipeline/registry/model_probe.py), else, without a run, those not declared scalar."""
    if probe is not None and probe.error is None:
        return list(probe.per_request)
    return [t.name for t in graph.outputs if t.shape != ()]


def output_lines(graph: GraphInfo, probe: Probe | None) -> list[str]:
    """What the run says about the outputs: those left out and why, and declared
    shapes the run contradicts (an exporter's mistake that does not matter here)."""
    if probe is None:
        return []
    if probe.error is not None:
        return [f"probe       the model refused {probe.rows} sample requests in one batch: {probe.error}"]
    lines = []
    for t in graph.outputs:
        gave = probe.gave[t.name]
        if t.name not in probe.per_request:
            why = (f"is a {t.type}, which tensor-json does not map (tensors and sequences of maps only)"
                   if gave == f"{probe.rows} rows" else f"gave {gave} for {probe.rows} requests, not one row each")
            lines.append(f"output      {t.name!r} {why}: left out of the starter config")
        elif t.shape is not None and (not t.shape or isinstance(t.shape[0], int)):
            lines.append(f"output      {t.name!r} is declared {t.shape_text()} but gives one row per request "
                         f"({gave} for {probe.rows}): the declaration is wrong, which does no harm")
    return lines


def pad_hints(graph: GraphInfo, dynamic: list[str]) -> list[str]:
    """For each dynamic dimension the model has a mask input over: the `pad` setting
    that lets ragged lengths share a batch (pipeline/codecs/tensor_pad.py)."""
    from pipeline.codecs.tensor_pad import padding

    hints = []
    for dim in dynamic:
        try:
            mask = padding({"dimension": dim, "buckets": list(PAD_BUCKETS)}, graph.inputs).mask
        except ValueError:
            continue  # no mask over it: padding would change results
        hints.append(f"            or pad ragged {dim!r} to buckets, the codec filling mask {mask!r}: add "
                     f"pad: {{dimension: {dim}, buckets: [{', '.join(map(str, PAD_BUCKETS))}]}} to the entry")
    return hints


# The broker_profile line of the starter config says what the other profiles are for:
# on the embedded broker the kafka profile's session timeout makes every start wait
# ~23 s for its partitions (consumers/profiles.py), and a new user cannot know that.
def _profile_note(profile: str) -> str:
    others = "; ".join(f"{name} for {broker}" for name, broker in PROFILES.items() if name != profile)
    return f"{PROFILES[profile]}; {others} (`tidebatch broker` runs the embedded one)"


@dataclass(frozen=True)
class Broker:
    """Where the starter config's worker will connect, and with which client profile."""

    bootstrap_servers: str = "127.0.0.1:9092"
    profile: str = "kafka"


def starter_config(graph: GraphInfo, name: str, outputs: list[str] | None = None, broker: Broker = Broker()) -> str:
    entry = {
        "name": name,
        "model": str(graph.path),
        "version": "1",
        "codec": "tensor-json",
        "input_topic": f"{name}.requests",
        "output_topic": f"{name}.results",
        "inputs": {t.name: t.name for t in graph.inputs},  # request field -> model input
        # result field -> model output
        "outputs": {o: o for o in (outputs if outputs is not None else [t.name for t in graph.outputs])},
    }
    doc = {
        "pipeline": name,
        "bootstrap_servers": broker.bootstrap_servers,
        "broker_profile": broker.profile,
        "batching": {"policy": "adaptive", "slo_ms": 100},
        "pipelines": [entry],
    }
    text = yaml.safe_dump(doc, sort_keys=False, width=1000)
    line = f"broker_profile: {broker.profile}\n"
    return text.replace(line, f"broker_profile: {broker.profile}  # {_profile_note(broker.profile)}\n", 1)


def report(graph: GraphInfo, probe: Probe | None = None, broker: Broker = Broker()) -> str:
    """The whole text; `probe` is what running the model on sample requests showed
    (pipeline/registry/model_probe.py), None where it was not run (the inputs cannot be filled)."""
    name = pipeline_name(graph)
    outputs = per_request_outputs(graph, probe)
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(graph.opsets.items()))
    lines = [
        f"model       {graph.path}",
        f"format      IR version {graph.ir_version}; opsets {opsets}" + (f"; producer {graph.producer}" if graph.producer else ""),
        "inputs",
        *_table(graph.inputs),
        "outputs",
        *_table(graph.outputs),
    ]
    problems = batching_problems(graph)
    if not outputs:
        problems.append("no output gives one row per request, so no result can carry one")
    dynamic = sorted({d for t in graph.inputs for d in (t.shape or ())[1:] if isinstance(d, str)})
    if problems:
        lines += ["batching    NO: " + problems[0], *("            " + p for p in problems[1:])]
        if any(isinstance(t.shape[0], int) for t in graph.inputs if t.shape):
            lines += ["fix         make dimension 0 dynamic:", "  " + fix_text(graph, graph.path.name)]
    else:
        first = {str(t.shape[0]) for t in graph.inputs if t.shape}
        verdict = f"batching    yes: dimension 0 of every input is dynamic ({', '.join(sorted(first))})"
        if probe is not None and probe.error is None:
            verdict += f"; {probe.rows} sample requests in one batch got a row each from {_count(outputs, graph)}"
        lines.append(verdict)
    lines += output_lines(graph, probe)
    if dynamic:
        lines.append(f"dynamic     {', '.join(dynamic)}: requests of equal sizes share a batch (no padding)")
        lines += pad_hints(graph, dynamic)
    sample = orjson.dumps(sample_request(graph, name)).decode()
    lines += ["", "sample request (tensor-json; the batch dimension is left out):"]
    if len(sample) <= MAX_SAMPLE_CHARS:
        lines.append(sample)
    else:
        lines.append(f"  ({len(sample)} characters: one field per input, each an array of the input's shape without dimension 0)")
    if probe is not None and probe.error is None and probe.result:
        result = orjson.dumps(probe.result).decode()
        lines += ["", "sample result (the model's fields of its result document; a map becomes an object):"]
        lines.append(result if len(result) <= MAX_SAMPLE_CHARS else f"  ({len(result)} characters)")
    lines += ["", f"starter config ({name}.yaml; run it with `tidebatch run -c {name}.yaml`):",
              starter_config(graph, name, outputs, broker)]
    return "\n".join(lines).rstrip() + "\n"


def _count(outputs: list[str], graph: GraphInfo) -> str:
    return "every output" if len(outputs) == len(graph.outputs) else f"{len(outputs)} of {len(graph.outputs)} outputs"


def _table(tensors: tuple[TensorInfo, ...]) -> list[str]:
    width = max((len(t.name) for t in tensors), default=0)
    # a ZipMap's "seq(map(int64,tensor(float)))" is wider than any tensor type
    kind = max(18, *(len(t.type) + 1 for t in tensors)) if tensors else 18
    return [f"  {t.name:<{width}}  {t.type:<{kind}} {t.shape_text()}" for t in tensors]
