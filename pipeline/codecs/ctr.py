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

This module holds the codec: the flow of a request, the batch, the split of the scores.
ctr_fields.py reads and checks the document's fields, ctr_features.py builds the model's
arrays (JSON requests one by one, binary ones many at once).

Speed: the worker decodes a poll's JSON requests together (decode_many: ctr_fast.py and
ctr_scan.py read their values from the bytes, ~2.35x less CPU; see
docs/schemas/ctr_request.md, "Speed: the JSON fast path"); what that path doubts comes
here. Here, per-value work stays in C where it can (orjson;
``map(dict.get, keys)``; ``set(map(type, ...))`` for type checks; one ``bytes.fromhex``
for all tokens of a request; the hashing is a few numpy ops on the whole request). The
slow, per-value error search runs only once a request is known to be invalid.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from models.ctr import features as F
from pipeline.codecs import ctr_binary, ctr_fast
from pipeline.codecs.base import Decoded, DecodeError, Sample
from pipeline.codecs.ctr_features import (
    CtrPayload,
    featurise_binary,
    featurise_cat,
    featurise_dense,
)
from pipeline.codecs.ctr_fields import (
    BinaryHeader,
    items_list,
    missing_or_type,
    parse_json,
    read_binary_item_ids,
    read_item_ids,
    read_meta,
    read_request_id,
    type_name,
)
from pipeline.codecs.record_types import DOUBLE, FLOAT, META_FIELDS, STRING, Field, ListOf, Record
from pipeline.codecs.tenant_peek import peek_tenant

log = logging.getLogger(__name__)

__all__ = ["CtrCodec", "CtrPayload"]  # CtrPayload lives in ctr_features.py: the codec's payload type


class CtrCodec:
    """Decode CTR ranking requests, stack them into model feeds, split the scores."""

    name = "ctr"

    def __init__(self, max_items: int = 1000) -> None:
        if isinstance(max_items, bool) or not isinstance(max_items, int) or max_items < 1:
            raise ValueError(f"max_items must be a positive integer, got {max_items!r}")
        self.max_items = max_items

    def samples(self, seed: int) -> Callable[[int], Sample]:
        """Valid requests (the Codec protocol's optional sample maker, base.py): the
        load generator's, pipeline/loadgen/ctr.py."""
        from pipeline.loadgen.ctr import CtrRequestFactory

        factory = CtrRequestFactory(seed=seed)
        return lambda i: (*factory.make(i), [])

    def tenant_of(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> str | None:
        """The request's tenant without decoding it, or None when unsure (the Codec
        protocol's optional peek, base.py): admission sheds the records of tenant
        classes over their share first (pipeline/codecs/tenant_peek.py)."""
        if ctr_binary.is_binary(value):
            try:
                return peek_tenant(ctr_binary.header_bytes(value))
            except Exception:  # a malformed header: the decode will say why
                return None
        return peek_tenant(value)

    # ------------------------------------------------------------------------ decode
    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None = None) -> Decoded:
        """Validate and featurise one request, JSON or binary form (ctr_binary.py).
        ``headers`` are not used."""
        if ctr_binary.is_binary(value):
            return self._decode_binary(value)
        return self.decode_document(parse_json(value), value)

    def decode_document(self, doc: dict[str, Any], raw: bytes = b"") -> Decoded:
        """One request already read into its fields: the JSON path after parsing, and
        the schema-registry codecs' records (schema_wire.py). `raw`: the JSON text,
        read again only for the reason of an integer beyond 64 bits."""
        request_id = read_request_id(doc)
        priority, deadline_ms, tenant = read_meta(doc, raw)
        context = doc.get("context")
        if type(context) is not dict:
            raise missing_or_type(doc, "context", "object")
        items = items_list(doc, self.max_items)
        n = len(items)
        if set(map(type, items)) != {dict}:
            i = next(i for i, it in enumerate(items) if type(it) is not dict)
            raise DecodeError(f"items[{i}]: expected object, got {type_name(items[i])}")
        item_ids = read_item_ids(items)
        payload = CtrPayload(featurise_dense(context, items), featurise_cat(context, items))
        return Decoded(
            request_id=request_id,
            rows=n,
            payload=payload,
            priority=priority,
            deadline_ms=deadline_ms,
            tenant=tenant,
            extra={"item_ids": item_ids},
        )

    def request_type(self, name: str) -> Record:
        """A request's fields (record_types.py), for its Avro, Protobuf and JSON Schema
        forms: those of the JSON request (docs/schemas/ctr_request.md), counts as doubles."""
        return ctr_request_type(name)

    def result_fields(self) -> tuple[Field, ...]:
        return (Field("item_ids", ListOf(STRING)), Field("scores", ListOf(FLOAT)))

    def decode_many(self, values: Sequence[tuple[bytes | None, Mapping[str, bytes] | None]]) -> list[Decoded | Exception]:
        """decode() for a poll's worth of messages, in order: a Decoded or the exception
        (DecodeError = invalid input) per message. Both forms are featurised many at a
        time: hashing a request's ~270 tokens is a dozen numpy calls whatever their
        number, and the JSON form's values are read from the bytes of the whole poll
        at once (ctr_fast.py). A JSON request the fast path doubts, and every invalid
        one, goes through decode(): same features bit for bit, same reasons."""
        out: list[Decoded | Exception | None] = [None] * len(values)
        binary: list[tuple[int, BinaryHeader, ctr_binary.BinaryParts]] = []
        json_at: list[int] = []
        for i, (value, _) in enumerate(values):
            if not ctr_binary.is_binary(value):
                json_at.append(i)
                continue
            try:
                head = self._binary_header(value)
                binary.append((i, head, ctr_binary.locate(value, len(head.item_ids))))
            except Exception as exc:  # the caller tells DecodeError from a codec bug
                out[i] = exc
        fast = self._fast_json([values[i][0] for i in json_at])
        for i, decoded in zip(json_at, fast, strict=True):
            if decoded is None:
                try:
                    decoded = self.decode(*values[i])
                except Exception as exc:  # the caller tells DecodeError from a codec bug
                    out[i] = exc
                    continue
            out[i] = decoded
        if binary:
            for (i, _, _), decoded in zip(binary, featurise_binary(binary), strict=True):
                out[i] = decoded
        return out  # type: ignore[return-value]  # every slot is filled above

    def _fast_json(self, values: list[bytes | None]) -> list[Decoded | None]:
        """ctr_fast.decode_json, or all None (every request the reference way) if it
        fails: a bug there must cost speed, not the poll."""
        if not values:
            return []
        try:
            return ctr_fast.decode_json(values, self.max_items)
        except Exception as exc:
            log.warning("CTR JSON fast path failed (%s: %s); this poll is decoded one by one",
                        type(exc).__name__, exc)
            return [None] * len(values)

    def _decode_binary(self, value: bytes) -> Decoded:
        head = self._binary_header(value)
        return featurise_binary([(0, head, ctr_binary.locate(value, len(head.item_ids)))])[0]

    def _binary_header(self, value: bytes) -> BinaryHeader:
        header = ctr_binary.header_bytes(value)
        try:
            doc = parse_json(header)
        except DecodeError as exc:
            raise DecodeError(f"binary header: {exc}") from None
        request_id = read_request_id(doc)
        priority, deadline_ms, tenant = read_meta(doc, header)
        return BinaryHeader(request_id, priority, deadline_ms, tenant, read_binary_item_ids(doc, self.max_items))

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
def ctr_request_type(name: str) -> Record:
    """A CTR request's fields: the JSON request's, every feature optional (missing)."""

    def features(dense: tuple[str, ...], cat: tuple[str, ...]) -> tuple[Field, ...]:
        return (*(Field(f, DOUBLE, optional=True) for f in dense), *(Field(f, STRING, optional=True) for f in cat))

    context = Record("Context", features(F.CONTEXT_DENSE, F.CONTEXT_CAT))
    item = Record("Item", (Field("item_id", STRING), *features(F.ITEM_DENSE, F.ITEM_CAT)))
    return Record(name, (*META_FIELDS, Field("user_id", STRING, optional=True), Field("context", context),
                         Field("items", ListOf(item))))


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
