"""Codec for CTR ranking requests: one JSON request = one user context + N candidate
items = N model rows of the ``ctr`` model (models/ctr).

Request schema (UTF-8 JSON object; also in docs/schemas/ctr_request.md)::

    {
      "request_id": str, 1..128 characters          required
      "tenant":      str | null                      optional
      "priority":    int 0..9 | null                 optional, default 0 (lower runs first)
      "deadline_ms": int > 0 | null                  optional, the request's own latency budget
                                                     (above 2^63-1 saturates to 2^63-1)
      "user_id":     str | null                      optional (the producer's Kafka key)
      "context": {                                   required object (may be {})
        "I1".."I6":   number | null                  counts; absent or null = missing
        "C1".."C13":  hex string | null              Criteo-style tokens, e.g. "68fd1e64"
      },
      "items": [                                     required, 1..max_items entries
        {"item_id": str (non-empty),                 required
         "I7".."I13": number | null,
         "C14".."C26": hex string | null}, ...
      ]
    }

Unknown extra fields are ignored. An absent feature key counts as missing (Criteo has
missing values); a present key with the wrong type is an error. A hex string is 1..16
ASCII hex digits (either case); "" is not a token (send null). Negative counts are
accepted and treated as 0 by the model; counts above 1e9 saturate, whatever their size
(``1e309`` and 400-digit integers too: jsonnum.py parses what orjson refuses). Integers
beyond 64 bits stay integers in reasons ("priority: expected int 0..9, got
100000000000...(401 digits)"), never "got float". Documents nested deeper than 1024
levels are refused: "JSON nested deeper than 1024 levels (documented limit)".

Every invalid input raises DecodeError with a one-line reason, e.g.::

    empty message value
    value is not valid UTF-8 (byte 0xff at offset 12)
    malformed JSON: unexpected end of data at line 1 column 41
    missing field 'items'
    items[3].C14: expected hex string or null, got int
    too many items: 1500 > max_items 1000
    request_id: expected non-empty string, got int

Model feeds (see models/ctr/features.py): ``dense`` float32 [n,13] raw counts with NaN
for missing, ``cat`` int64 [n,26] hashed ids (context fields repeated on every item
row). Result per request: ``{"request_id", "item_ids", "scores"}`` with one click
probability per item, in request order.

Speed: decoding is on the hot path, so per-value work stays in C where it can (orjson;
``map(dict.get, keys)``; ``set(map(type, ...))`` for type checks; one ``bytes.fromhex``
for all tokens of a request; the hashing is a few numpy ops on the whole request). The
slow, per-value error search runs only once a request is known to be invalid.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from models.ctr import features as F
from pipeline.codecs import ctr_binary, jsonnum
from pipeline.codecs.base import Decoded, DecodeError

MAX_REQUEST_ID_CHARS = 128
_N_CTX_CAT = len(F.CONTEXT_CAT)  # 13
_N_ITEM_CAT = len(F.ITEM_CAT)  # 13
_N_CTX_DENSE = len(F.CONTEXT_DENSE)  # 6
_N_ITEM_DENSE = len(F.ITEM_DENSE)  # 7
_NUMBER_TYPES = frozenset({int, float, type(None)})
_TYPE_NAMES = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "string",
    list: "array",
    dict: "object",
}


@dataclass(slots=True)
class CtrPayload:
    dense: np.ndarray  # float32 [n, 13], NaN = missing
    cat: np.ndarray  # int64 [n, 26]


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _short(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else repr(value[: limit - 3]) + "..."


class CtrCodec:
    """Decode CTR ranking requests, stack them into model feeds, split the scores."""

    name = "ctr"

    def __init__(self, max_items: int = 1000) -> None:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ValueError(f"max_items must be a positive integer, got {max_items!r}")
        self.max_items = max_items

    # ------------------------------------------------------------------------ decode
    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        """Validate and featurise one request, JSON or binary form (ctr_binary.py).
        ``headers`` are not used."""
        if ctr_binary.is_binary(value):
            return self._decode_binary(value)
        doc = _parse_json(value)
        request_id = _request_id(doc)
        priority, deadline_ms, tenant = _meta(doc, value)
        context = doc.get("context")
        if type(context) is not dict:
            raise _missing_or_type(doc, "context", "object")
        items = _items_list(doc, self.max_items)
        n = len(items)
        if set(map(type, items)) != {dict}:
            i = next(i for i, it in enumerate(items) if type(it) is not dict)
            raise DecodeError(f"items[{i}]: expected object, got {_type_name(items[i])}")
        item_ids = _item_ids(items)
        payload = CtrPayload(_dense(context, items), _cat(context, items))
        return Decoded(
            request_id=request_id,
            rows=n,
            payload=payload,
            priority=priority,
            deadline_ms=deadline_ms,
            tenant=tenant,
            extra={"item_ids": item_ids},
        )

    def decode_many(self, values: Sequence[tuple[bytes | None, Mapping[str, bytes] | None]]) -> list[Decoded | Exception]:
        """decode() for a poll's worth of messages, in order: a Decoded or the exception
        (DecodeError = invalid input) per message. Binary requests are featurised
        together: hashing a request's ~270 tokens is a dozen numpy calls whatever their
        number, so one pass for all of them costs ~2 us a request instead of ~8."""
        out: list[Decoded | Exception | None] = [None] * len(values)
        binary: list[tuple[int, _BinaryHeader, ctr_binary.BinaryParts]] = []
        for i, (value, headers) in enumerate(values):
            try:
                if ctr_binary.is_binary(value):
                    head = self._binary_header(value)
                    binary.append((i, head, ctr_binary.locate(value, len(head.item_ids))))
                else:
                    out[i] = self.decode(value, headers)
            except Exception as exc:  # the caller tells DecodeError from a codec bug
                out[i] = exc
        if binary:
            for (i, _, _), decoded in zip(binary, _featurise_binary(binary), strict=True):
                out[i] = decoded
        return out  # type: ignore[return-value]  # every slot is filled above

    def _decode_binary(self, value: bytes) -> Decoded:
        head = self._binary_header(value)
        return _featurise_binary([(0, head, ctr_binary.locate(value, len(head.item_ids)))])[0]

    def _binary_header(self, value: bytes) -> _BinaryHeader:
        header = ctr_binary.header_bytes(value)
        try:
            doc = _parse_json(header)
        except DecodeError as exc:
            raise DecodeError(f"binary header: {exc}") from None
        request_id = _request_id(doc)
        priority, deadline_ms, tenant = _meta(doc, header)
        return _BinaryHeader(request_id, priority, deadline_ms, tenant, _binary_item_ids(doc, self.max_items))

    # ------------------------------------------------------------------------ batch
    def collate(
        self, payloads: Sequence[CtrPayload], pad_to_rows: int | None = None
    ) -> dict[str, np.ndarray]:
        """Stack payloads in order; padding rows (dense 0, cat = missing ids) go last."""
        total = sum(len(p.cat) for p in payloads)
        rows = total if pad_to_rows is None else pad_to_rows
        if rows < total:
            raise ValueError(f"pad_to_rows {pad_to_rows} < {total} rows in the batch")
        pad = rows - total
        dense = _stack([p.dense for p in payloads], bytes(4 * F.N_DENSE * pad), np.float32, F.N_DENSE)
        cat = _stack([p.cat for p in payloads], _MISSING_ROW * pad, np.int64, F.N_CAT)
        return {"dense": dense, "cat": cat}

    def split(
        self, outputs: Mapping[str, np.ndarray], decoded: Sequence[Decoded]
    ) -> list[dict[str, Any]]:
        """Slice ``prob`` back per request in collate order; trailing padding is dropped."""
        prob = np.asarray(outputs["prob"]).reshape(-1)
        total = sum(d.rows for d in decoded)
        if len(prob) < total:
            raise ValueError(f"model returned {len(prob)} scores for {total} rows")
        scores = prob[:total].tolist()  # one C-level conversion for the whole batch
        results: list[dict[str, Any]] = []
        offset = 0
        for d in decoded:
            results.append(
                {
                    "request_id": d.request_id,
                    "item_ids": d.extra["item_ids"],
                    "scores": scores[offset : offset + d.rows],
                }
            )
            offset += d.rows
        return results


# ---------------------------------------------------------------------------- helpers
class _BinaryHeader(NamedTuple):
    request_id: str
    priority: int
    deadline_ms: int | None
    tenant: str | None
    item_ids: list[str]


def _featurise_binary(requests: list[tuple[int, _BinaryHeader, ctr_binary.BinaryParts]]) -> list[Decoded]:
    """Model rows for checked binary requests: each field of all requests joined into
    one array, context columns repeated onto their items' rows, one hash for all; each
    request's payload is a row slice of the shared arrays."""
    counts = np.fromiter((len(h.item_ids) for _, h, _ in requests), dtype=np.intp, count=len(requests))
    total = int(counts.sum())

    def joined(field: int, dtype: str, width: int) -> np.ndarray:
        return np.frombuffer(b"".join([p[field] for _, _, p in requests]), dtype).reshape(-1, width)

    tokens = np.empty((total, F.N_CAT), dtype=np.uint64)
    tokens[:, :_N_CTX_CAT] = np.repeat(joined(0, "<u8", _N_CTX_CAT), counts, axis=0)
    tokens[:, _N_CTX_CAT:] = joined(1, "<u8", _N_ITEM_CAT)
    present = np.empty((total, F.N_CAT), dtype=np.bool_)
    present[:, :_N_CTX_CAT] = np.repeat(joined(4, "|b1", _N_CTX_CAT), counts, axis=0)
    present[:, _N_CTX_CAT:] = joined(5, "|b1", _N_ITEM_CAT)
    cat = F.hash_ids(tokens, present)
    # No clip here, unlike JSON floats (which must not overflow the float32 cast):
    # these already are float32, and the graph clips counts to DENSE_CLIP itself.
    dense = np.empty((total, F.N_DENSE), dtype=np.float32)
    dense[:, :_N_CTX_DENSE] = np.repeat(joined(2, "<f4", _N_CTX_DENSE), counts, axis=0)
    dense[:, _N_CTX_DENSE:] = joined(3, "<f4", _N_ITEM_DENSE)
    out: list[Decoded] = []
    at = 0
    for _, head, _ in requests:
        n = len(head.item_ids)
        out.append(
            Decoded(
                request_id=head.request_id,
                rows=n,
                payload=CtrPayload(dense[at : at + n], cat[at : at + n]),
                priority=head.priority,
                deadline_ms=head.deadline_ms,
                tenant=head.tenant,
                extra={"item_ids": head.item_ids},
            )
        )
        at += n
    return out


_MISSING_ROW = F.MISSING_IDS.astype(np.int64).tobytes()  # one padding row of cat


def _stack(parts: list[np.ndarray], padding: bytes, dtype: type, width: int) -> np.ndarray:
    """The parts' rows, then the padding, as one writable [rows, width] array.

    One bytearray join: a memcpy per part with the GIL held. np.concatenate released and
    re-took the GIL for every part, and each re-take in the executor waited for the
    source thread to give it up: 25 parts took 68 us alone and 379 us beside a busy
    thread, against 21 and 31 us this way."""
    for p in parts:
        if p.dtype != dtype or not p.flags.c_contiguous or p.ndim != 2 or p.shape[1] != width:
            raise ValueError(f"payload arrays must be C-contiguous {np.dtype(dtype)} [n, {width}]")
    buf = bytearray().join([*(p.data for p in parts), padding])
    return np.frombuffer(buf, dtype=dtype).reshape(-1, width)
def _parse_json(value: bytes | None) -> dict[str, Any]:
    if value is None or len(value) == 0:
        raise DecodeError("empty message value")
    try:
        doc = jsonnum.loads(value)
    except json.JSONDecodeError as exc:
        raise DecodeError(_json_error(value, exc)) from None
    if type(doc) is not dict:
        raise DecodeError(f"expected a JSON object at top level, got {_type_name(doc)}")
    return doc


def _json_error(value: bytes, exc: json.JSONDecodeError) -> str:
    # orjson reports bad UTF-8 as "str is not valid UTF-8" at char 0; find the byte.
    try:
        bytes(value).decode("utf-8")
    except UnicodeDecodeError as bad:
        byte = bytes(value)[bad.start]
        return f"value is not valid UTF-8 (byte 0x{byte:02x} at offset {bad.start})"
    return f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"


def _missing_or_type(doc: Mapping[str, Any], key: str, expected: str) -> DecodeError:
    if key not in doc:
        return DecodeError(f"missing field {key!r}")
    return DecodeError(f"{key}: expected {expected}, got {_type_name(doc[key])}")


def _items_list(doc: Mapping[str, Any], max_items: int, key: str = "items") -> list[Any]:
    """doc[key]: a list of 1..max_items entries (their contents checked later)."""
    items = doc.get(key)
    if type(items) is not list:
        raise _missing_or_type(doc, key, "array")
    if not items:
        raise DecodeError(f"{key}: expected at least 1 item, got 0")
    if len(items) > max_items:
        raise DecodeError(f"too many items: {len(items)} > max_items {max_items}")
    return items


def _request_id(doc: Mapping[str, Any]) -> str:
    rid = doc.get("request_id")
    if type(rid) is str and 0 < len(rid) <= MAX_REQUEST_ID_CHARS:
        return rid
    if "request_id" not in doc:
        raise DecodeError("missing field 'request_id'")
    if type(rid) is not str:
        raise DecodeError(f"request_id: expected non-empty string, got {_type_name(rid)}")
    if not rid:
        raise DecodeError("request_id: expected non-empty string, got ''")
    raise DecodeError(
        f"request_id: expected at most {MAX_REQUEST_ID_CHARS} characters, got {len(rid)}"
    )


def _meta(doc: Mapping[str, Any], raw: bytes) -> tuple[int, int | None, str | None]:
    """priority, deadline_ms, tenant; null or absent = default. user_id is checked only.
    ``raw`` is the JSON text of ``doc``, read again only on the error path (an integer
    beyond 64 bits that orjson gave as a float)."""
    priority = doc.get("priority")
    if priority is None:
        priority = 0
    elif type(priority) is not int or not 0 <= priority <= 9:
        raise DecodeError(f"priority: expected int 0..9, got {_shown_number(priority, raw, 'priority')}")
    deadline = doc.get("deadline_ms")
    if deadline is not None and (type(deadline) is not int or not 0 < deadline <= jsonnum.INT64_MAX):
        deadline = _saturated_deadline(deadline, raw)
    tenant = doc.get("tenant")
    if tenant is not None and type(tenant) is not str:
        raise DecodeError(f"tenant: expected string or null, got {_type_name(tenant)}")
    user_id = doc.get("user_id")
    if user_id is not None and type(user_id) is not str:
        raise DecodeError(f"user_id: expected string or null, got {_type_name(user_id)}")
    return priority, deadline, tenant


def _saturated_deadline(deadline: object, raw: bytes) -> int:
    """A deadline_ms that is not a plain int64 > 0: any larger integer saturates to
    INT64_MAX (a budget that long never tightens the SLO, and the value stays one every
    reader of the result can hold); anything else is refused."""
    if type(deadline) is int and deadline > 0:
        return jsonnum.INT64_MAX
    if type(deadline) is float:
        literal = jsonnum.int_literal(raw, "deadline_ms")
        if literal is not None and not literal.startswith("-"):
            return jsonnum.INT64_MAX
    raise DecodeError(f"deadline_ms: expected int > 0, got {_shown_number(deadline, raw, 'deadline_ms')}")


def _shown_number(value: object, raw: bytes, key: str) -> str:
    """The refused value of an integer field for a reason: the int, or the integer
    literal that orjson read as a float (shortened), else the type's name."""
    if type(value) is int:
        return jsonnum.show_int(str(value))
    if type(value) is float:
        literal = jsonnum.int_literal(raw, key)
        if literal is not None:
            return jsonnum.show_int(literal)
    return _type_name(value)


def _item_ids(items: list[dict[str, Any]]) -> list[str]:
    ids = [it.get("item_id") for it in items]
    if set(map(type, ids)) == {str} and "" not in ids:
        return ids
    for i, (it, iid) in enumerate(zip(items, ids, strict=True)):
        if "item_id" not in it:
            raise DecodeError(f"missing field 'items[{i}].item_id'")
        if type(iid) is not str or not iid:
            got = "''" if iid == "" else _type_name(iid)
            raise DecodeError(f"items[{i}].item_id: expected non-empty string, got {got}")
    raise AssertionError("unreachable")


def _binary_item_ids(doc: Mapping[str, Any], max_items: int) -> list[str]:
    ids = _items_list(doc, max_items, "item_ids")
    if set(map(type, ids)) == {str} and "" not in ids:
        return ids
    i, bad = next((i, v) for i, v in enumerate(ids) if type(v) is not str or not v)
    got = "''" if bad == "" else _type_name(bad)
    raise DecodeError(f"item_ids[{i}]: expected non-empty string, got {got}")


def _dense(context: dict[str, Any], items: list[dict[str, Any]]) -> np.ndarray:
    ctx_vals = list(map(context.get, F.CONTEXT_DENSE))
    item_vals = list(chain.from_iterable(map(it.get, F.ITEM_DENSE) for it in items))
    ctx_types = set(map(type, ctx_vals))
    item_types = set(map(type, item_vals))
    if not ctx_types <= _NUMBER_TYPES:
        raise _first_bad(context, "context", F.CONTEXT_DENSE, "number or null")
    if not item_types <= _NUMBER_TYPES:
        raise _first_bad_item(items, F.ITEM_DENSE, "number or null")
    n = len(items)
    # Only a float can overflow float32 (orjson ints are < 2**64 < 3.4e38), so counts
    # sent as ints go straight to float32; np.array turns None into NaN ("missing").
    wide = float in ctx_types or float in item_types
    dense = np.empty((n, F.N_DENSE), dtype=np.float64 if wide else np.float32)
    dense[:, :_N_CTX_DENSE] = np.array(ctx_vals, dtype=dense.dtype)
    dense[:, _N_CTX_DENSE:] = np.array(item_vals, dtype=dense.dtype).reshape(n, _N_ITEM_DENSE)
    if not wide:
        return dense
    # clip before the float32 cast so absurd values saturate instead of overflowing to inf
    # (NaN passes through; the graph clips negatives to 0 anyway)
    np.clip(dense, -F.DENSE_CLIP, F.DENSE_CLIP, out=dense)
    return dense.astype(np.float32)


@functools.lru_cache(maxsize=256)
def _field_layout(n: int) -> np.ndarray:
    """Field index of each token in the flat list of a request with n items."""
    return np.concatenate([np.arange(_N_CTX_CAT), np.tile(np.arange(_N_CTX_CAT, F.N_CAT), n)])


def _cat(context: dict[str, Any], items: list[dict[str, Any]]) -> np.ndarray:
    # one flat list: 13 context tokens, then 13 per item (row-major); one parse, one hash
    toks = list(map(context.get, F.CONTEXT_CAT))
    toks.extend(chain.from_iterable(map(it.get, F.ITEM_CAT) for it in items))
    try:
        values, present = F.parse_tokens(toks)  # also the type check
    except F.HexTokenError as exc:
        raise _bad_token(exc) from None
    return _cat_matrix(values, present, len(items))


def _cat_matrix(values: np.ndarray, present: np.ndarray, n: int) -> np.ndarray:
    """[n, 26] hashed ids from 13 context tokens then 13 per item (flat, row-major)."""
    ids = F.hash_ids(values, present, _field_layout(n))
    cat = np.empty((n, F.N_CAT), dtype=np.int64)
    cat[:, :_N_CTX_CAT] = ids[:_N_CTX_CAT]
    cat[:, _N_CTX_CAT:] = ids[_N_CTX_CAT:].reshape(n, _N_ITEM_CAT)
    return cat


# ---------------------------------------------------------------------------- error paths
def _first_bad(obj: dict[str, Any], where: str, keys: Sequence[str], expected: str) -> DecodeError:
    for key in keys:
        v = obj.get(key)
        if type(v) not in _NUMBER_TYPES:
            return DecodeError(f"{where}.{key}: expected {expected}, got {_type_name(v)}")
    raise AssertionError("no bad value found")


def _first_bad_item(items: list[dict[str, Any]], keys: Sequence[str], expected: str) -> DecodeError:
    for i, it in enumerate(items):
        for key in keys:
            v = it.get(key)
            if type(v) not in _NUMBER_TYPES:
                return DecodeError(f"items[{i}].{key}: expected {expected}, got {_type_name(v)}")
    raise AssertionError("no bad value found")


def _bad_token(exc: F.HexTokenError) -> DecodeError:
    """Name the field of the bad token from its position in the flat token list."""
    pos = exc.index
    if pos < _N_CTX_CAT:
        where = f"context.{F.CONTEXT_CAT[pos]}"
    else:
        i, j = divmod(pos - _N_CTX_CAT, _N_ITEM_CAT)
        where = f"items[{i}].{F.ITEM_CAT[j]}"
    token = exc.token
    if type(token) is not str:
        got = _type_name(token)
    else:
        got = "''" if token == "" else _short(token)
    return DecodeError(f"{where}: expected hex string or null, got {got}")
