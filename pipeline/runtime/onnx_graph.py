"""What an ONNX file says about itself: inputs and outputs (names, types, shapes with
dynamic dimensions by name), IR version and opsets, for `tidebatch inspect` and the
`tensor-json` codec (pipeline/codecs/tensor_json.py).

Inputs and outputs come from ONNX Runtime, which the worker needs anyway; the header
(IR version, opsets, producer) is read from the file's protobuf fields directly,
because the `onnx` package is only a dev dependency (pyproject.toml) and ONNX Runtime
does not report them. Reading the header also works on a model that ONNX Runtime
refuses (onnx 1.23 writes IR version 14, which ONNX Runtime 1.31 refuses), so the
error can name the cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import UserError
from pipeline.extras import onnxruntime

# ONNX Runtime's tensor element names -> numpy dtypes (strings are Python objects).
DTYPES: dict[str, np.dtype] = {
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint64": np.dtype(np.uint64),
    "uint32": np.dtype(np.uint32),
    "uint16": np.dtype(np.uint16),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "string": np.dtype(object),
}
# ORT's error prefix and C++ source location: "[ONNXRuntimeError] : 1 : FAIL : ...
# /onnxruntime_src/.../model.cc:256 onnxruntime::Model::Model(...) <the reason>"
_ORT_NOISE = re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : |\S*onnxruntime_src\S* [^(]*\([^)]*\)\s*")
UNNAMED = "?"  # a dynamic dimension without a name (dim_param) in the graph


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type: str  # ONNX Runtime's text: "tensor(float)", "seq(map(int64,tensor(float)))"
    shape: tuple[int | str, ...] | None  # None: not a tensor; str: a dynamic dimension

    @property
    def element(self) -> str | None:
        """"float" for "tensor(float)"; None for a sequence or map."""
        if self.type.startswith("tensor(") and self.type.endswith(")"):
            return self.type[len("tensor("):-1]
        return None

    @property
    def dtype(self) -> np.dtype | None:
        element = self.element
        return DTYPES.get(element) if element is not None else None

    def shape_text(self) -> str:
        if self.shape is None:
            return "-"
        return "[" + ", ".join(str(d) for d in self.shape) + "]"


@dataclass(frozen=True, slots=True)
class GraphInfo:
    path: Path
    ir_version: int | None
    opsets: dict[str, int]  # domain ("" = the default ONNX domain) -> version
    producer: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


def read_graph(path: str | Path) -> GraphInfo:
    """Inputs, outputs and header of an ONNX file. Raises UserError (one line) for a
    missing file, one that is not an ONNX model, or one ONNX Runtime cannot load."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"model file not found: {p}")
    try:
        ir_version, opsets, producer = read_header(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"{p}: not an ONNX model ({exc})") from None
    ort = onnxruntime("reading a model's inputs and outputs")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # its warnings are not the user's problem here
    try:
        session = ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf/... classes
        # ORT names the newest IR version it reads (13 for 1.31, 14 for 1.32): quote it.
        newest = re.search(r"max supported IR version: (\d+)", str(exc))
        if newest is not None:
            detail = (f"IR version {ir_version} is newer than it reads ({newest.group(1)}): "
                      "set model.ir_version = 10 and save again")
        else:
            detail = _ORT_NOISE.sub("", str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
        raise UserError(f"{p}: ONNX Runtime cannot load it: {detail}") from None
    return GraphInfo(
        path=p.resolve(),
        ir_version=ir_version,
        opsets=opsets,
        producer=producer,
        inputs=tuple(_info(a) for a in session.get_inputs()),
        outputs=tuple(_info(a) for a in session.get_outputs()),
    )


def _info(arg: object) -> TensorInfo:
    kind = str(arg.type)  # type: ignore[attr-defined]
    shape = None
    if kind.startswith("tensor("):
        shape = tuple(d if isinstance(d, int) else (d or UNNAMED) for d in arg.shape)  # type: ignore[attr-defined]
    return TensorInfo(str(arg.name), kind, shape)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- protobuf
# ModelProto's field numbers (onnx/onnx.proto): 1 ir_version, 2 producer_name,
# 8 opset_import (OperatorSetIdProto: 1 domain, 2 version).
def read_header(data: bytes) -> tuple[int | None, dict[str, int], str]:
    """(ir_version, opsets, producer_name) from a serialized ModelProto; only the top
    level is walked, the graph is skipped. Raises ValueError for bytes that are not a
    well-formed protobuf message or have no opset (every ONNX model has one)."""
    ir_version: int | None = None
    producer = ""
    opsets: dict[str, int] = {}
    for number, value in _fields(memoryview(data)):
        if number == 1 and isinstance(value, int):
            ir_version = value
        elif number == 2 and isinstance(value, memoryview):
            producer = bytes(value).decode("utf-8", "replace")
        elif number == 8 and isinstance(value, memoryview):
            domain, version = "", 0
            for n, v in _fields(value):
                if n == 1 and isinstance(v, memoryview):
                    domain = bytes(v).decode("utf-8", "replace")
                elif n == 2 and isinstance(v, int):
                    version = v
            opsets[domain] = version
    if not opsets:
        raise ValueError("no opset_import")
    return ir_version, opsets, producer


def _varint(data: memoryview, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7


def _fields(data: memoryview) -> list[tuple[int, int | memoryview]]:
    """(field number, value) of each field of one message: varints as int,
    length-delimited fields as views (a graph of gigabytes is not copied),
    fixed-width fields skipped."""
    out: list[tuple[int, int | memoryview]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire == 0:
            value, i = _varint(data, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(data, i)
            if i + size > len(data):
                raise ValueError("truncated field")
            out.append((number, data[i:i + size]))
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    if i != len(data):
        raise ValueError("truncated message")
    return out
