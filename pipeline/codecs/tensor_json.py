"""`tensor-json`: a generic codec for any ONNX model, configured rather than coded
(docs/OWN_MODEL.md). A request is a JSON object whose fields hold the model's inputs as
(nested) arrays; the dtypes and shapes come from the ONNX graph (pipeline/runtime/onnx_graph.py).

Request (rows "one", the default: one example per request, the batch dimension left out):

    {"request_id": "r1", "dense": [0.1, 0.2, 0.3, 0.4], "tokens": [5, 7, 9]}

With rows "many" each field carries its own leading rows dimension (a ranker's
candidates), all fields the same number of rows. ``request_id`` (required), ``priority``,
``deadline_ms`` and ``tenant`` mean what they mean for CTR requests (pipeline/codecs/
ctr_fields.py reads them). Field names map to model inputs by configuration (default:
the input's own name).

Validation, one line per refused request, naming the field: missing field, wrong type
("tokens[1]: expected int, got float"), wrong number of dimensions, a fixed dimension of
the wrong size, or a named dimension (e.g. "seq") whose size differs between two fields.

Batching: requests whose non-batch shapes are equal share a bucket (Decoded.bucket), so
a batch never mixes sequence lengths and needs no padding; each result is then the one
a model run on the request alone gives.

Result: one field per configured output (default: every output under its own name):
the request's row (rows "one") or rows as nested lists; a sequence-of-maps output (a
tree ensemble's ZipMap probabilities) gives one object per row, its keys as strings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from pipeline.codecs import jsonnum
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.ctr_fields import parse_json, read_meta, read_request_id, type_name
from pipeline.codecs.record_types import META_FIELDS, Field, Record, element, nested, result_types
from pipeline.codecs.tensor_pad import cut, length_of, pad_request, padding
from pipeline.runtime.onnx_graph import TensorInfo

RESERVED = ("request_id", "priority", "deadline_ms", "tenant", "user_id")
ROWS = ("one", "many")
MAX_DIMS = 32  # numpy takes at most 64; no model input has more than a handful
_JSON_TYPES = {"f": ("int", "float"), "i": ("int",), "u": ("int",), "b": ("bool",), "O": ("string",)}


@dataclass(frozen=True, slots=True)
class InputField:
    field: str  # the request's field
    name: str  # the model's input
    dtype: np.dtype
    dims: tuple[int | str, ...]  # after the batch dimension; str: dynamic


class TensorJsonCodec:
    name = "tensor-json"

    def __init__(
        self,
        inputs: Sequence[TensorInfo],
        outputs: Sequence[TensorInfo],
        fields: Mapping[str, str] | None = None,
        results: Mapping[str, str] | None = None,
        rows: str = "one",
        max_rows: int = 1000,
        pad: Mapping[str, Any] | None = None,
    ) -> None:
        """fields: request field -> model input (default: every input by its name);
        results: result field -> model output (default: every output by its name);
        pad: a dynamic dimension padded to bucket edges, the mask input filled here
        (tensor_pad.py). Raises ValueError (one line) for settings that do not fit the model."""
        if rows not in ROWS:
            raise ValueError(f"rows must be one of {', '.join(ROWS)}, got {rows!r}")
        self.pad = padding(pad, inputs) if pad else None
        mask = self.pad.mask if self.pad else None
        by_name = {t.name: t for t in inputs}
        fields = dict(fields) if fields else {t.name: t.name for t in inputs if t.name != mask}
        for field, name in fields.items():
            if name not in by_name:
                raise ValueError(f"inputs.{field}: the model has no input {name!r}; its inputs: {', '.join(by_name)}")
            if field in RESERVED:
                raise ValueError(f"inputs.{field}: {field!r} is a reserved request field")
            if name == mask:
                raise ValueError(f"inputs.{field}: {name!r} is the mask the codec fills (pad.mask); leave it out")
        unmapped = [n for n in by_name if n not in fields.values() and n != mask]
        if unmapped:
            raise ValueError(f"inputs: model input(s) {', '.join(unmapped)} have no request field")
        self.fields: list[InputField] = []
        for field, name in fields.items():
            t = by_name[name]
            if t.dtype is None or t.shape is None:
                raise ValueError(f"input {name!r} has type {t.type}, which tensor-json cannot fill")
            if not t.shape or isinstance(t.shape[0], int):
                raise ValueError(f"input {name!r} has no dynamic batch dimension (shape {t.shape_text()}): "
                                 "`tidebatch inspect` shows how to make dimension 0 dynamic")
            self.fields.append(InputField(field, name, t.dtype, t.shape[1:]))
        self.input_dims = {f.name: f.dims for f in self.fields}
        self.collated = list(self.fields)  # the inputs collate() stacks: the fields, and a pad's mask
        if self.pad is not None:
            if not any(self.pad.dimension in f.dims for f in self.fields):
                raise ValueError(f"pad.dimension: only the mask has dimension {self.pad.dimension!r}")
            self.collated.append(InputField(mask, mask, self.pad.mask_dtype, (self.pad.dimension,)))
        self.out_dims = {t.name: t.shape[1:] for t in outputs if t.shape}
        self.out_types, self.out_depth = result_types(outputs)
        out_names = [t.name for t in outputs]
        self.results = dict(results) if results else {n: n for n in out_names}
        for field, name in self.results.items():
            if name not in out_names:
                raise ValueError(f"outputs.{field}: the model has no output {name!r}; its outputs: {', '.join(out_names)}")
            out = next(t for t in outputs if t.name == name)
            if out.shape == ():  # split() gives each request its rows; a scalar has none
                raise ValueError(f"outputs.{field}: output {name!r} is a scalar, not one row per request")
            if out.shape is None and not out.type.startswith("seq(map("):
                # a ZipMap's sequence has a map per row; any other sequence or map has no rows
                raise ValueError(f"outputs.{field}: output {name!r} is a {out.type}: tensor-json maps tensors and "
                                 "sequences of maps (one per row); leave it out of outputs")
        self.many = rows == "many"
        self.max_rows = max_rows

    # ------------------------------------------------------------------------ decode
    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        return self.decode_document(self.document(value), value or b"")

    def decode_document(self, doc: dict[str, Any], raw: bytes = b"") -> Decoded:
        """One request already read into its fields (this codec's JSON or msgpack, or a
        schema-registry record: schema_wire.py): the one path from fields to feeds."""
        request_id = read_request_id(doc)
        priority, deadline_ms, tenant = read_meta(doc, raw)
        payload: dict[str, np.ndarray] = {}
        named: dict[str, tuple[int, str]] = {}  # dimension name -> (size, first field with it)
        n_rows: tuple[int, str] | None = None
        for f in self.fields:
            if f.field not in doc:
                raise DecodeError(f"missing field {f.field!r}")
            try:
                arr = self.array(f, doc[f.field])
            except DecodeError as exc:
                raise self._refined(exc, f, raw or None) from None
            if self.many:
                if arr.ndim == 0:
                    raise DecodeError(f"{f.field}: expected an array of rows, got a {type_name(doc[f.field])}")
                if n_rows is None:
                    n_rows = (arr.shape[0], f.field)
                    if not 1 <= arr.shape[0] <= self.max_rows:
                        raise DecodeError(f"{f.field}: expected 1..{self.max_rows} rows, got {arr.shape[0]}")
                elif arr.shape[0] != n_rows[0]:
                    raise DecodeError(f"{f.field}: {arr.shape[0]} rows, but {n_rows[0]} in field {n_rows[1]!r}")
                check_dims(f, arr.shape[1:], named)
            else:
                check_dims(f, arr.shape, named)
                arr = arr[None]
            payload[f.name] = arr
        rows = n_rows[0] if n_rows is not None else 1
        if self.pad is not None:
            length, field = named[self.pad.dimension]
            pad_request(payload, self.input_dims, length, rows, self.pad, field)
        bucket = tuple(a.shape[1:] for a in payload.values())
        return Decoded(request_id, rows, payload, priority, deadline_ms, tenant, bucket)

    def document(self, value: bytes | None) -> dict[str, Any]:
        """The request as a mapping of fields (the binary form overrides: tensor_binary.py).
        JSON has no NaN or Infinity: a message with one is malformed, and the reason
        names its field rather than a column."""
        try:
            return parse_json(value)
        except DecodeError as exc:
            found = jsonnum.nonfinite_literal(value) if str(exc).startswith("malformed JSON") and value else None
            if found is None:
                raise
            raise DecodeError(f"{found[0]}: {found[1]} is not valid JSON (JSON numbers are finite)") from None

    def literal(self, value: bytes | None, field: str) -> Any:
        """`field` of the message as written, integer literals as jsonnum.IntText (the
        binary form has none: msgpack integers are 64-bit). Error path only."""
        return jsonnum.exact_field(value, field) if value else None

    def _refined(self, exc: DecodeError, f: InputField, value: bytes | None) -> DecodeError:
        """An integer beyond 64 bits reads as a float (orjson), refused as "expected int,
        got float": where the first wrong element was written as such an integer, the
        reason says it is out of range, as for one within 64 bits."""
        if f.dtype.kind not in "iu" or not str(exc).endswith("got float"):
            return exc
        info = np.iinfo(f.dtype)
        for leaf in _leaves(self.literal(value, f.field)):
            if isinstance(leaf, jsonnum.IntText):
                digits = leaf.lstrip("-")
                if len(digits) > 20 or not info.min <= int(leaf) <= info.max:
                    return DecodeError(f"{f.field}: value out of range for {f.dtype.name} ({info.min}..{info.max})")
            elif type(leaf) is float:
                break  # a float literal came first: the reason stands
        return exc

    def array(self, f: InputField, value: Any) -> np.ndarray:
        """One field's value as an array of its input's dtype, not yet shape-checked."""
        return to_array(f.field, value, f.dtype)

    def request_type(self, name: str) -> Record:
        """The request's fields (record_types.py) for its Avro, Protobuf and JSON Schema
        forms: one list level per dimension of the input (and rows, with rows many)."""
        lead = 1 if self.many else 0
        return Record(name, (*META_FIELDS, *(Field(f.field, nested(element(f.dtype), lead + len(f.dims)))
                                             for f in self.fields)))

    def result_fields(self) -> tuple[Field, ...]:
        """The result's fields as split() gives them: a tensor's row in nested lists, a
        sequence of maps' row as a map with string keys."""
        return tuple(Field(field, nested(self.out_types[name], (1 if self.many else 0) + self.out_depth[name]))
                     for field, name in self.results.items())

    def encode(self, doc: Mapping[str, Any]) -> bytes:
        """A request document (fields as nested lists) in this codec's form: for the
        generated requests of the warm-up and `tidebatch produce`."""
        return orjson.dumps(doc)

    # ------------------------------------------------------------------------ collate
    def collate(self, payloads: Sequence[dict[str, np.ndarray]], pad_to_rows: int | None = None) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for f in self.collated:
            parts = [p[f.name] for p in payloads]
            total = sum(len(a) for a in parts)
            if pad_to_rows is not None and pad_to_rows > total:
                pad = np.zeros((pad_to_rows - total, *parts[0].shape[1:]), dtype=f.dtype)
                if f.dtype == object:
                    pad[...] = ""
                parts.append(pad)
            feeds[f.name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return feeds

    # ------------------------------------------------------------------------ split
    def split(self, outputs: Mapping[str, Any], decoded: Sequence[Decoded]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = [{} for _ in decoded]
        total = sum(d.rows for d in decoded)
        for field, name in self.results.items():
            out = outputs[name]
            if len(out) < total:
                raise ValueError(f"output {name!r} has {len(out)} rows for a batch of {total}")
            start = 0
            dims = self.out_dims.get(name, ())
            trim = self.pad is not None and self.pad.dimension in dims
            for doc, d in zip(results, decoded, strict=True):
                if trim:  # a per-position output: the request's own positions only
                    n = length_of(d.payload, self.pad)
                    part = [_json_value(cut(out[i], dims, n, self.pad)) for i in range(start, start + d.rows)]
                else:
                    part = [_json_value(out[i]) for i in range(start, start + d.rows)]
                doc[field] = part if self.many else part[0]
                start += d.rows
        return results


def _json_value(row: Any) -> Any:
    """One output row as JSON: arrays as nested lists, a map (ZipMap) as an object
    with string keys (JSON has no other), numpy scalars as Python numbers."""
    if isinstance(row, np.ndarray | np.generic):
        return row.tolist()
    if isinstance(row, Mapping):
        return {str(k): _json_value(v) for k, v in row.items()}
    if isinstance(row, list | tuple):
        return [_json_value(v) for v in row]
    return row


def _leaves(value: Any) -> Iterator[Any]:
    """The leaves of nested lists, in document order."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is list:
            stack.extend(reversed(v))
        else:
            yield v


def check_dims(f: InputField, shape: tuple[int, ...], named: dict[str, tuple[int, str]]) -> None:
    """A request's value for `f` (batch dimension removed) against the input's dims."""
    if len(shape) != len(f.dims):
        want = "[" + ", ".join(map(str, f.dims)) + "]"
        raise DecodeError(f"{f.field}: expected {len(f.dims)} dimension(s) {want}, got shape {list(shape)}")
    for i, (want, got) in enumerate(zip(f.dims, shape, strict=True)):
        if isinstance(want, int):
            if got != want:
                raise DecodeError(f"{f.field}: dimension {i + 1} must have size {want}, got {got}")
            continue
        if got == 0:
            raise DecodeError(f"{f.field}: dimension {want!r} is empty")
        if want in named and named[want][0] != got:
            size, other = named[want]
            raise DecodeError(f"{f.field}: dimension {want!r} has size {got}, but {size} in field {other!r}")
        named.setdefault(want, (got, f.field))


def to_array(field: str, value: Any, dtype: np.dtype) -> np.ndarray:
    """A JSON value (number, bool, string or nested arrays of them) as an array of
    `dtype`; DecodeError names the first wrong element ("tokens[2]: expected int, got
    float"), a ragged array, or a number out of the dtype's range."""
    kind = dtype.kind
    accepted = _JSON_TYPES[kind]
    try:
        arr = np.array(value, dtype=object if kind == "O" else None)
    except (ValueError, OverflowError):
        raise DecodeError(_ragged_or_bad(field, value, accepted)) from None
    if arr.size == 0 and arr.dtype.kind != "O":  # `[]` reads as float64; its shape is refused later
        return arr.astype(dtype)
    got = arr.dtype.kind
    ok = {"f": "fiu", "i": "iu", "u": "iu", "b": "b", "O": "O"}[kind]
    if got not in ok or (kind == "O" and not all(type(v) is str for v in arr.flat)):
        raise DecodeError(_ragged_or_bad(field, value, accepted))
    if kind in "iu":
        info = np.iinfo(dtype)
        if arr.size and (arr.min() < info.min or arr.max() > info.max):
            raise DecodeError(f"{field}: value out of range for {dtype.name} ({info.min}..{info.max})")
    if kind == "f":
        with np.errstate(over="ignore"):
            arr = arr.astype(dtype)
        if not np.isfinite(arr).all():
            raise DecodeError(f"{field}: number out of range for {dtype.name}")
        return arr
    return arr.astype(dtype, copy=False)


def _ragged_or_bad(field: str, value: Any, accepted: tuple[str, ...]) -> str:
    """The reason a value did not make an array: its first leaf of a wrong JSON type,
    else a ragged nesting (rows of different lengths)."""
    want = " or ".join(accepted)
    stack: list[tuple[str, Any, int]] = [(field, value, 0)]
    while stack:
        path, v, depth = stack.pop()
        if type(v) is list:
            if depth == MAX_DIMS:
                return f"{field}: nested deeper than {MAX_DIMS} levels"
            stack.extend((f"{path}[{i}]", x, depth + 1) for i, x in reversed(list(enumerate(v))))
        elif type_name(v) not in accepted:
            return f"{path}: expected {want}, got {type_name(v)}"
    return f"{field}: ragged array (rows of different lengths)"
