"""Model features of `tidebatch etl` inputs (pipeline/etl/inputs.py has the layout):
flat tables (Parquet, CSV, flat JSONL rows) featurised column by column, vectorised
with Arrow and numpy, each bad row rejected with a one-line reason in the codec's
wording; and JSON requests already decoded by the worker's codec (JSONL request lines,
Kafka records)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from models.ctr import features as F
from pipeline.codecs.base import Decoded
from pipeline.codecs.ctr_fields import MAX_REQUEST_ID_CHARS
from pipeline.etl.inputs import REQUIRED, Features, InputError, Reject

_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{1,16}\Z")
_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_LUT[ord(_c)] = _i
    _HEX_LUT[ord(_c.upper())] = _i
_NIBBLE_WEIGHTS = np.array([16 ** (7 - k) for k in range(8)], dtype=np.uint64)


# ----------------------------------------------------------------------------- flat tables
def check_schema(schema: pa.Schema, source: str) -> None:
    """Fail the job (not rows) when a column is missing or of a type no row can fix."""
    names = set(schema.names)
    for col in REQUIRED:
        if col not in names:
            raise InputError(f"input {source}: missing column {col!r} (flat layout: docs/ETL.md)")
    for col in schema.names:
        t = _value_type(schema.field(col).type)
        if col in ("request_id", "item_id", "key") and not (_is_text(t) or pa.types.is_integer(t) or pa.types.is_null(t)):
            raise InputError(f"input {source}: column {col!r} has type {t}, expected strings")
        elif col in F.DENSE_FIELDS and not (_is_text(t) or _is_number(t) or pa.types.is_null(t)):
            raise InputError(f"input {source}: column {col!r} has type {t}, expected numbers")
        elif col in F.CAT_FIELDS and not (_is_text(t) or pa.types.is_null(t)):
            raise InputError(f"input {source}: column {col!r} has type {t}, expected hex strings")
        elif col == "timestamp_ms" and not (pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_null(t)):
            raise InputError(f"input {source}: column 'timestamp_ms' has type {t}, expected epoch milliseconds")


def _value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name).combine_chunks() if table.column(name).num_chunks != 1 else table.column(name).chunk(0)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    return col


def featurize_flat(table: pa.Table, first: int, fallback_ts: int, source: str) -> tuple[Features, list[Reject]]:
    """Vectorised: flat rows -> features of the valid rows + rejects (the first bad
    column of a row, in layout order, gives its reason)."""
    check_schema(table.schema, source)
    n = table.num_rows
    reasons: dict[int, str] = {}
    rid = _text(_column(table, "request_id"))
    iid = _text(_column(table, "item_id"))
    rid_len = _lengths(rid)
    _flag(reasons, (rid_len == 0) | (rid_len > MAX_REQUEST_ID_CHARS), lambda i: _bad_id("request_id", rid[i].as_py()))
    _flag(reasons, _lengths(iid) == 0, lambda i: _bad_id("item_id", iid[i].as_py()))
    dense = np.empty((n, F.N_DENSE), dtype=np.float64)
    for j, name in enumerate(F.DENSE_FIELDS):
        dense[:, j] = _dense_column(_column(table, name), name, reasons)
    cat = np.empty((n, F.N_CAT), dtype=np.int64)
    for j, name in enumerate(F.CAT_FIELDS):
        cat[:, j] = _cat_ids(table.column(name), j, name, reasons)
    valid = np.ones(n, dtype=bool)
    valid[list(reasons)] = False
    rejects = [Reject(first + i, reasons[i], _row_dict(table, i)) for i in sorted(reasons)]
    np.minimum(dense, F.DENSE_CLIP, out=dense)  # as the codec: absurd counts saturate
    if not reasons:  # the common case: no copies
        keep = None
        kept = n
    else:
        keep = pa.array(valid)
        kept = int(valid.sum())
        dense, cat = dense[valid], cat[valid]
    rid_valid = rid if keep is None else rid.filter(keep)
    ts = _timestamps(table, n)
    ts_valid = ts if keep is None else ts.filter(keep)
    key = _text(_column(table, "key")) if "key" in table.column_names else pa.nulls(n, pa.string())
    feats = Features(
        dense=dense.astype(np.float32),
        cat=cat,
        request_id=rid_valid,
        item_id=iid if keep is None else iid.filter(keep),
        item_pos=_item_positions(rid_valid),
        offset=(first + np.flatnonzero(valid)).astype(np.int64),
        record_ts=ts_valid,
        part_ts=_part_ts(ts_valid, fallback_ts),
        key=key if keep is None else key.filter(keep),
        priority=pa.nulls(kept, pa.int32()),
        tenant=pa.nulls(kept, pa.string()),
    )
    return feats, rejects


def _text(col: pa.Array) -> pa.Array:
    return col if pa.types.is_string(col.type) else pc.cast(col, pa.string())


def _lengths(col: pa.Array) -> np.ndarray:
    return pc.fill_null(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)


def _flag(reasons: dict[int, str], mask: np.ndarray, why: Any) -> None:
    for i in np.flatnonzero(mask).tolist():
        if i not in reasons:
            reasons[i] = why(i)


def _bad_id(name: str, value: Any) -> str:
    if value is None:
        return f"{name}: expected non-empty string, got null"
    if value == "":
        return f"{name}: expected non-empty string, got ''"
    return f"{name}: expected at most {MAX_REQUEST_ID_CHARS} characters, got {len(value)}"


def _dense_column(col: pa.Array, name: str, reasons: dict[int, str]) -> np.ndarray:
    if pa.types.is_null(col.type):
        return np.full(len(col), np.nan)
    if _is_text(col.type):
        # CSV and loosely typed files: validate text, then cast what is a number
        ok = pc.fill_null(pc.match_substring_regex(col, _NUMBER), True).to_numpy(zero_copy_only=False)
        empty = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), False).to_numpy(zero_copy_only=False)
        _flag(reasons, ~ok & ~empty, lambda i: f"{name}: expected number or null, got {_short(col[i].as_py())}")
        clean = pc.if_else(pa.array(ok & ~empty), col, pa.scalar(None, pa.string()))
        return pc.cast(pc.utf8_trim_whitespace(clean), pa.float64()).to_numpy(zero_copy_only=False)
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)


def _cat_ids(chunked: pa.ChunkedArray, field: int, name: str, reasons: dict[int, str]) -> np.ndarray:
    """Hashed model ids of one categorical column. Tokens repeat a lot (Zipf), so each
    distinct token is parsed and hashed once: Parquet hands them over dictionary-encoded
    (read_dictionary), other inputs are dictionary-encoded here; then one `take`."""
    n = len(chunked)
    missing = F.MISSING_IDS[field]
    col = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    if pa.types.is_null(col.type):
        return np.full(n, missing, dtype=np.int64)
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    dictionary = _text(col.dictionary)
    values, bad = _parse_tokens(dictionary)
    # one extra entry past the dictionary stands for null: then a single gather
    dict_ids = np.append(F.hash_ids(values, fields=field), missing)
    indices = col.indices
    if indices.null_count:
        indices = pc.fill_null(indices, len(dictionary))
    index = indices.to_numpy(zero_copy_only=False)
    ids = dict_ids[index]
    if bad.any():
        bad_rows = np.append(bad, False)[index]
        _flag(reasons, bad_rows, lambda i: f"{name}: expected hex string or null, got {_short(dictionary[int(index[i])].as_py())}")
    return ids


def _parse_tokens(tokens: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """uint64 value and badness of each token (1..16 ASCII hex digits, as the codec).
    Criteo-shaped 8-digit tokens go through one cast and a lookup table; other lengths
    through a per-token parse."""
    m = len(tokens)
    values = np.zeros(m, dtype=np.uint64)
    bad = np.zeros(m, dtype=bool)
    if m == 0:
        return values, bad
    lengths = _lengths(tokens)
    eight = lengths == 8
    if eight.any():
        fixed = pc.cast(pc.if_else(pa.array(eight), tokens, pa.scalar("00000000")), pa.binary(8))
        raw = np.frombuffer(fixed.buffers()[1], dtype=np.uint8, count=8 * m, offset=8 * fixed.offset)
        nibbles = _HEX_LUT[raw.reshape(m, 8)]
        bad = eight & (nibbles == 255).any(axis=1)
        parsed = np.where(nibbles == 255, 0, nibbles).astype(np.uint64) @ _NIBBLE_WEIGHTS
        values = np.where(eight, parsed, values)
    for i in np.flatnonzero(~eight).tolist():
        token = tokens[i].as_py()
        if token is not None and _HEX_TOKEN.match(token):
            values[i] = int(token, 16)
        else:
            bad[i] = True
    return values, bad


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _timestamps(table: pa.Table, n: int) -> pa.Array:
    ts_type = pa.timestamp("ms", tz="UTC")
    if "timestamp_ms" not in table.column_names:
        return pa.nulls(n, ts_type)
    col = _column(table, "timestamp_ms")
    if pa.types.is_timestamp(col.type):
        return pc.cast(col, ts_type)
    return pc.cast(pc.cast(col, pa.int64()), ts_type)


def _part_ts(ts: pa.Array, fallback: int) -> np.ndarray:
    as_int = pc.cast(ts, pa.int64())
    return pc.fill_null(as_int, fallback).to_numpy(zero_copy_only=False).astype(np.int64)


def _item_positions(rid: pa.Array) -> np.ndarray:
    """Position of each row within its run of equal request_id (rows of a request are
    consecutive)."""
    n = len(rid)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    change = np.ones(n, dtype=bool)
    if n > 1:
        change[1:] = pc.fill_null(pc.not_equal(rid[1:], rid[:-1]), True).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(change)
    run_start = np.repeat(starts, np.diff(np.append(starts, n)))
    return (np.arange(n) - run_start).astype(np.int32)


def _row_dict(table: pa.Table, i: int) -> dict[str, Any]:
    row = table.slice(i, 1).to_pylist()[0]
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}


# ----------------------------------------------------------------------------- decoded requests
def features_from_requests(
    decoded: Sequence[Decoded],
    offsets: Sequence[int],
    keys: Sequence[str | None],
    timestamps: Sequence[int | None],
    fallback_ts: int,
) -> Features:
    """JSON requests decoded by the worker's codec (JSONL request lines, Kafka records)."""
    lengths = np.array([d.rows for d in decoded], dtype=np.int64)
    take = pa.array(np.repeat(np.arange(len(decoded)), lengths))
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    ts = pa.array(list(timestamps), pa.timestamp("ms", tz="UTC")).take(take)
    if decoded:
        dense = np.concatenate([d.payload.dense for d in decoded])
        cat = np.concatenate([d.payload.cat for d in decoded])
    else:
        dense = np.empty((0, F.N_DENSE), np.float32)
        cat = np.empty((0, F.N_CAT), np.int64)
    return Features(
        dense=dense,
        cat=cat,
        request_id=pa.array([d.request_id for d in decoded], pa.string()).take(take),
        item_id=pa.array([i for d in decoded for i in d.extra["item_ids"]], pa.string()),
        item_pos=(np.arange(total) - starts).astype(np.int32),
        offset=np.repeat(np.asarray(offsets, dtype=np.int64), lengths),
        record_ts=ts,
        part_ts=_part_ts(ts, fallback_ts),
        key=pa.array(list(keys), pa.string()).take(take),
        priority=pa.array([d.priority for d in decoded], pa.int32()).take(take),
        tenant=pa.array([d.tenant for d in decoded], pa.string()).take(take),
    )
