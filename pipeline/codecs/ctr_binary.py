"""The binary form of a CTR request: the same request as the JSON schema, with the
features as little-endian arrays instead of ~20 JSON values per item.

Why: turning JSON into Python objects costs about 1.5 us per item before any feature
work (orjson, 20 values per item), and the source thread's Python work is what caps
the pipeline on a small machine (bench/ctr_codec.py, bench/pipeline_capacity.py).
Here only a small JSON header is parsed; the features are views on the message bytes.
It plays the part of Triton's binary tensor extension (a JSON header plus raw tensors).
The worker tells the two forms apart by the first bytes of the value (JSON starts
with "{" or whitespace, this form with the magic), so both can share a topic.

Layout (all integers little-endian; n = number of items)::

    offset  size         field
    0       4            magic b"TBC1"
    4       4            uint32 H: header length in bytes
    8       H            UTF-8 JSON object: request_id, tenant, priority, deadline_ms,
                         user_id (as in the JSON form) and "item_ids": [n strings];
                         the encoder pads it with spaces so 8 + H is a multiple of 8
    8+H     8*13         uint64  context tokens C1..C13 (the hex token's value)
            8*13*n       uint64  item tokens C14..C26, row-major
            4*6          float32 context counts I1..I6 (NaN = missing)
            4*7*n        float32 item counts I7..I13, row-major (NaN = missing)
            13 + 13*n    uint8   1 = token present, 0 = missing (context, then items)

    total = 8 + H + 141 + 145 * n bytes, exactly

A token's value is what its hex string means (``int("68fd1e64", 16)``), so both forms
hash to the same ids; the encoder clips counts to DENSE_CLIP like the JSON form (the graph clips them too). docs/schemas/ctr_request.md
documents both forms.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

import numpy as np
import orjson

from models.ctr import features as F
from pipeline.codecs.base import DecodeError, Sample

MAGIC = b"TBC1"
_PREFIX = struct.Struct("<4sI")
_N_CTX_CAT = len(F.CONTEXT_CAT)
_N_ITEM_CAT = len(F.ITEM_CAT)
_N_CTX_DENSE = len(F.CONTEXT_DENSE)
_N_ITEM_DENSE = len(F.ITEM_DENSE)
FIXED_BYTES = 8 * _N_CTX_CAT + 4 * _N_CTX_DENSE + _N_CTX_CAT  # 141
BYTES_PER_ITEM = 8 * _N_ITEM_CAT + 4 * _N_ITEM_DENSE + _N_ITEM_CAT  # 145
_HEADER_KEYS = ("request_id", "tenant", "priority", "deadline_ms", "user_id")


def is_binary(value: bytes | None) -> TypeGuard[bytes]:
    return value is not None and value[:4] == MAGIC


class BinaryParts(NamedTuple):
    """The byte ranges of one request's arrays, checked but not yet arrays: a poll's
    worth of requests is joined per field and turned into arrays once
    (CtrCodec.decode_many), instead of five small numpy arrays per request."""

    ctx_tokens: memoryview  # 13 x uint64
    item_tokens: memoryview  # 13n x uint64
    ctx_dense: memoryview  # 6 x float32
    item_dense: memoryview  # 7n x float32
    ctx_present: memoryview  # 13 x uint8 (0/1)
    item_present: memoryview  # 13n x uint8 (0/1)


def locate(value: bytes, n_items: int) -> BinaryParts:
    """Check the length and the presence bytes of a request with ``n_items`` items
    (known from its header) and return where its arrays are."""
    h = header_length(value)
    expected = 8 + h + FIXED_BYTES + BYTES_PER_ITEM * n_items
    if len(value) != expected:
        raise DecodeError(
            f"binary request: expected {expected} bytes for {n_items} items, got {len(value)}"
        )
    buf = memoryview(value)
    a = 8 + h
    b = a + 8 * _N_CTX_CAT
    c = b + 8 * _N_ITEM_CAT * n_items
    d = c + 4 * _N_CTX_DENSE
    e = d + 4 * _N_ITEM_DENSE * n_items
    f = e + _N_CTX_CAT
    if value[e:].translate(None, b"\x00\x01"):  # in C; a numpy max() costs more here
        raise DecodeError("binary request: token presence bytes must be 0 or 1")
    return BinaryParts(buf[a:b], buf[b:c], buf[c:d], buf[d:e], buf[e:f], buf[f:])


def header_length(value: bytes) -> int:
    if len(value) < 8:
        raise DecodeError(f"binary request: {len(value)} bytes is shorter than its 8-byte prefix")
    _, h = _PREFIX.unpack_from(value)
    if 8 + h > len(value):
        raise DecodeError(f"binary request: header length {h} runs past the end ({len(value)} bytes)")
    return h


def header_bytes(value: bytes) -> bytes:
    h = header_length(value)
    return value[8 : 8 + h]


# ---------------------------------------------------------------------------- encode
def encode(doc: Mapping[str, Any]) -> bytes:
    """The binary form of a JSON-form request document (for producers and tests).
    Raises ValueError on what cannot be encoded (a token that is not 1..16 hex digits,
    a count that is not a number); other validation is the worker's."""
    items: Sequence[Mapping[str, Any]] = doc["items"]
    context: Mapping[str, Any] = doc.get("context") or {}
    header: dict[str, Any] = {k: doc[k] for k in _HEADER_KEYS if k in doc}
    header["item_ids"] = [it.get("item_id") for it in items]
    head = orjson.dumps(header)
    head += b" " * (-(8 + len(head)) % 8)
    tokens = [context.get(k) for k in F.CONTEXT_CAT]
    tokens += [it.get(k) for it in items for k in F.ITEM_CAT]
    try:
        values, present = F.parse_tokens(tokens)
    except F.HexTokenError as exc:
        raise ValueError(str(exc)) from None
    n_ctx = _N_CTX_CAT
    dense_ctx = _floats([context.get(k) for k in F.CONTEXT_DENSE])
    dense_items = _floats([it.get(k) for it in items for k in F.ITEM_DENSE])
    return b"".join(
        (
            _PREFIX.pack(MAGIC, len(head)),
            head,
            values[:n_ctx].astype("<u8").tobytes(),
            values[n_ctx:].astype("<u8").tobytes(),
            dense_ctx.tobytes(),
            dense_items.tobytes(),
            present.astype(np.uint8).tobytes(),
        )
    )


def _floats(values: list[Any]) -> np.ndarray:
    if any(v is not None and (type(v) is bool or not isinstance(v, int | float)) for v in values):
        raise ValueError("counts must be numbers or null")
    x = np.array(values, dtype=np.float64)  # None -> NaN
    return np.clip(x, -F.DENSE_CLIP, F.DENSE_CLIP).astype("<f4")


def binary_samples(make: Callable[[int], Sample]) -> Callable[[int], Sample]:
    """The same sample requests in the binary form (`tidebatch produce --encoding
    binary`, `tidebatch profile --encoding binary`)."""

    def make_binary(i: int) -> Sample:
        key, value, headers = make(i)
        return key, encode(orjson.loads(value)), headers

    return make_binary
