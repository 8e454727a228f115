"""Model inputs and outputs that are not numeric arrays, carried as numeric arrays, so
that the model process (model_process.py, model_host.py) can move them over its wire
(wire.py), which moves raw array bytes only.

- A string tensor (ONNX `tensor(string)`; numpy: an object array of str): the UTF-8
  bytes of all its elements in one uint8 array, and each element's byte length.
- A sequence of maps (ONNX `seq(map(int64|string, tensor(...)))`; ONNX Runtime gives a
  list of dicts): a tree ensemble's ZipMap class probabilities as skl2onnx and
  onnxmltools export them. All keys in one array, all values in one array, and each
  map's size.

The parts travel as arrays named "<name>\\0<part>" beside the plain numeric arrays,
and the frame's header says which names were packed and how (`packed`). `unpack` gives
back what ONNX Runtime gives in-process: equal dicts of the same Python values (a
float32 probability is the same double either way: float64 holds it exactly), so a
result does not depend on the executor (tests/integration/test_own_model.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

SEP = "\0"  # no ONNX name has it: onnx's checker refuses names that are not valid text
# the sequence types unpack() rebuilds; keys and values as ONNX Runtime writes them
_SEQ_MAP = re.compile(r"seq\(map\((int64|string),tensor\((\w+)\)\)\)\Z")


def carried(type_text: str) -> bool:
    """Whether a model input or output of this ONNX Runtime type ("tensor(float)",
    "seq(map(int64,tensor(float)))") can cross to the model process and back."""
    return type_text.startswith("tensor(") or _SEQ_MAP.match(type_text) is not None


def pack(values: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
    """(numeric arrays to send, header entry `packed`). Numeric arrays pass as they are;
    raises TypeError (one line) for a value of a kind this module cannot carry."""
    arrays: dict[str, np.ndarray] = {}
    packed: dict[str, list[Any]] = {}
    for name, value in values.items():
        if isinstance(value, np.ndarray) and value.dtype.kind not in "OU":
            arrays[name] = value
        elif isinstance(value, np.ndarray):
            _pack_strings(name, value.ravel().tolist(), arrays)
            packed[name] = ["str", list(value.shape)]
        elif isinstance(value, list) and all(isinstance(m, dict) for m in value):
            keys = _pack_flat(f"{name}{SEP}keys", [k for m in value for k in m], arrays)
            vals = _pack_flat(f"{name}{SEP}values", [v for m in value for v in m.values()], arrays)
            arrays[f"{name}{SEP}counts"] = np.fromiter((len(m) for m in value), np.int64, len(value))
            packed[name] = ["seq_map", keys, vals]
        else:
            raise TypeError(f"{name!r} is a {type(value).__name__}, which the model process cannot carry")
    return arrays, packed


def unpack(arrays: Mapping[str, np.ndarray], packed: Mapping[str, list[Any]] | None) -> dict[str, Any]:
    """The values pack() was given, in their order, from the arrays it made."""
    if not packed:
        return dict(arrays)
    out: dict[str, Any] = {}
    for key, arr in arrays.items():
        name = key.split(SEP, 1)[0]
        if name not in packed:
            out[name] = arr
        elif name not in out:
            out[name] = _rebuild(name, packed[name], arrays)
    return out


def _rebuild(name: str, how: list[Any], arrays: Mapping[str, np.ndarray]) -> Any:
    if how[0] == "str":
        return np.array(_strings(name, arrays), dtype=object).reshape(how[1])
    keys = _flat(f"{name}{SEP}keys", how[1], arrays)
    vals = _flat(f"{name}{SEP}values", how[2], arrays)
    maps, start = [], 0
    for n in arrays[f"{name}{SEP}counts"].tolist():
        maps.append(dict(zip(keys[start:start + n], vals[start:start + n], strict=True)))
        start += n
    return maps


def _pack_flat(prefix: str, items: list[Any], arrays: dict[str, np.ndarray]) -> str:
    """Keys or values of all maps as one array under `prefix`; returns their kind."""
    if items and all(type(v) is str for v in items):
        _pack_strings(prefix, items, arrays)
        return "str"
    if all(type(v) is int for v in items):  # bool is not int here: ONNX maps hold no bools
        arrays[prefix] = np.array(items, dtype=np.int64)
        return "int"
    if all(type(v) in (int, float) for v in items):
        arrays[prefix] = np.array(items, dtype=np.float64)  # exact for every float32 and double
        return "float"
    odd = next(v for v in items if type(v) not in (int, float, str))
    raise TypeError(f"{prefix.split(SEP)[0]!r} holds a {type(odd).__name__}, which the model process cannot carry")


def _flat(prefix: str, kind: str, arrays: Mapping[str, np.ndarray]) -> list[Any]:
    return _strings(prefix, arrays) if kind == "str" else arrays[prefix].tolist()


def _pack_strings(prefix: str, items: list[Any], arrays: dict[str, np.ndarray]) -> None:
    encoded = [str(s).encode("utf-8", "surrogatepass") for s in items]
    arrays[f"{prefix}{SEP}bytes"] = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    arrays[f"{prefix}{SEP}lengths"] = np.fromiter(map(len, encoded), np.int64, len(encoded))


def _strings(prefix: str, arrays: Mapping[str, np.ndarray]) -> list[str]:
    data = arrays[f"{prefix}{SEP}bytes"].tobytes()
    ends = np.cumsum(arrays[f"{prefix}{SEP}lengths"]).tolist()
    out, start = [], 0
    for end in ends:
        out.append(data[start:end].decode("utf-8", "surrogatepass"))
        start = end
    return out
