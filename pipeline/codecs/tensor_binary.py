"""`tensor-binary`: the `tensor-json` codec's requests as msgpack (docs/OWN_MODEL.md,
"The binary form"), with tensors as raw bytes: no number is printed or parsed.

Why msgpack: measured side by side with Arrow IPC on the same requests, three runs
of bench/tensor_binary.py, this codec's whole decode took 0.53-0.62x the JSON form's
time for a ranker's request (4 floats, 8 token ids), 0.33-0.37x for a 256-float
embedding and 0.02-0.03x for a 3x64x64 image; a one-row Arrow IPC stream took 1.7-2.1x,
1.1-1.5x and 0.04-0.06x: its schema message and reader set-up are paid per request,
which a stream of single requests cannot spread.

A request is a msgpack map with the JSON form's fields (request_id, priority,
deadline_ms, tenant and one field per model input). A tensor field is one of:

- raw bytes (msgpack bin): the elements in C order, little-endian, of the input's
  element type; the shape is the input's without the batch dimension (with `rows:
  many`, with a leading rows dimension), where one dynamic dimension may be left for
  the length to give;
- a map {"shape": [...], "data": <bin>}: the same bytes with their shape (any number of
  dynamic dimensions);
- nested arrays, as in the JSON form (string inputs take only these).

Everything after that (dimensions, shared dimension names, padding, results) is the
JSON form's (tensor_json.py), so a request gives the same result in either form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.codecs.base import DecodeError
from pipeline.codecs.ctr_fields import type_name
from pipeline.codecs.tensor_json import InputField, TensorJsonCodec, to_array


class TensorBinaryCodec(TensorJsonCodec):
    name = "tensor-binary"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            import msgpack
        except ImportError:
            raise ValueError("codec tensor-binary needs the msgpack package: pip install msgpack") from None
        self._unpackb, self._packb = msgpack.unpackb, msgpack.packb
        super().__init__(*args, **kwargs)
        # per field, worked out once (np.prod and a new dtype per request cost more
        # than the rest of a small request's decode): little-endian dtype, the dims
        # raw bytes fill (rows first with rows "many"), their known product, the unknown ones
        self._layout: dict[str, tuple[np.dtype, tuple[int | str, ...], int, list[str]]] = {}
        for f in self.fields:
            dims = (("rows",) if self.many else ()) + f.dims
            known = int(np.prod([d for d in dims if isinstance(d, int)]))
            self._layout[f.field] = (f.dtype.newbyteorder("<"), dims, known, [d for d in dims if isinstance(d, str)])

    def document(self, value: bytes | None) -> dict[str, Any]:
        if not value:
            raise DecodeError("empty message value")
        try:
            doc = self._unpackb(value, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises ExtraData, FormatError, StackError, ValueError...
            raise DecodeError(f"malformed msgpack: {type(exc).__name__}: {exc}".splitlines()[0][:200]) from None
        if type(doc) is not dict:
            raise DecodeError(f"expected a msgpack map at top level, got {type_name(doc)}")
        return doc

    def literal(self, value: bytes | None, field: str) -> Any:
        return None  # msgpack integers are 64-bit: none reads as a float

    def array(self, f: InputField, value: Any) -> np.ndarray:
        if type(value) is dict:
            return self._shaped(f, value)
        if type(value) is bytes:
            return self._raw(f, value, None)
        return to_array(f.field, value, f.dtype)

    def encode(self, doc: Mapping[str, Any]) -> bytes:
        out: dict[str, Any] = dict(doc)
        for f in self.fields:
            if f.field in out and f.dtype.kind != "O":
                arr = np.asarray(out[f.field], dtype=f.dtype.newbyteorder("<"))
                out[f.field] = {"shape": list(arr.shape), "data": arr.tobytes()}
        return self._packb(out)

    def _shaped(self, f: InputField, value: dict[Any, Any]) -> np.ndarray:
        shape, data = value.get("shape"), value.get("data")
        if set(value) != {"shape", "data"} or type(data) is not bytes:
            raise DecodeError(f"{f.field}: expected raw bytes, {{\"shape\": [...], \"data\": <bytes>}} or an array")
        if type(shape) is not list or any(type(d) is not int or d < 0 for d in shape) or len(shape) > 32:
            raise DecodeError(f"{f.field}.shape: expected a list of sizes >= 0, got {shape!r}"[:200])
        return self._raw(f, data, tuple(shape))

    def _raw(self, f: InputField, data: bytes, shape: tuple[int, ...] | None) -> np.ndarray:
        dtype = f.dtype
        if dtype.kind == "O":
            raise DecodeError(f"{f.field}: a string input takes an array of strings, not bytes")
        if len(data) % dtype.itemsize:
            raise DecodeError(f"{f.field}: {len(data)} bytes is not a whole number of {dtype.name} "
                              f"elements ({dtype.itemsize} bytes each)")
        little, dims, known, unknown = self._layout[f.field]
        arr = np.frombuffer(data, dtype=little)
        if shape is None:
            shape = _inferred(f.field, dims, known, unknown, arr.size)
        elif math.prod(shape) != arr.size:
            raise DecodeError(f"{f.field}: shape {list(shape)} holds {math.prod(shape)} elements, the data {arr.size}")
        arr = arr.reshape(shape)
        if dtype.kind == "f" and not np.isfinite(arr).all():  # as the JSON form, which has no NaN
            raise DecodeError(f"{f.field}: not a finite number (NaN or infinity)")
        if dtype.kind == "b" and arr.view(np.uint8).max(initial=0) > 1:
            raise DecodeError(f"{f.field}: a bool element is not 0 or 1")
        return arr.astype(dtype, copy=False)



def _inferred(field: str, dims: tuple[int | str, ...], known: int, unknown: list[str], size: int) -> tuple[int, ...]:
    """The shape raw bytes of `size` elements have: the input's dims (and rows), of
    which at most one is unknown."""
    if len(unknown) > 1:
        raise DecodeError(f"{field}: raw bytes of several dynamic dimensions ({', '.join(unknown)}) "
                          "need their shape: {\"shape\": [...], \"data\": <bytes>}")
    if (not unknown and size != known) or (unknown and (known == 0 or size % known or size == 0)):
        want = "[" + ", ".join(map(str, dims)) + "]"
        raise DecodeError(f"{field}: {size} elements do not fit shape {want}")
    if not unknown:
        return dims  # type: ignore[return-value]  # all ints here
    return tuple(d if isinstance(d, int) else size // known for d in dims)
