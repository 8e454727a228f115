"""Inputs of `tidebatch etl`: CTR requests from Parquet, CSV or JSONL files, or from a
Kafka topic range, read in chunks and turned into model features without per-row
Python where the format allows it (docs/ETL.md, "Input files").

Flat layout (Parquet, CSV, JSONL): one row per candidate item.

    request_id   string, 1..128 chars     required
    item_id      string, non-empty         required
    I1..I13      number or null            raw counts (null / NaN / empty = missing)
    C1..C26      hex string or null        Criteo tokens, 1..16 hex digits ("68fd1e64")
    timestamp_ms int (epoch ms), optional  record time: partitions the output by date/hour
    key          string, optional          e.g. the user id (the Kafka key in the worker)

Rows of one request are consecutive (item_pos counts within a run of equal
request_id). JSONL may instead hold one JSON request per line, exactly as produced to
Kafka (docs/schemas/ctr_request.md); it is decoded by the worker's own codec.

A row that cannot be scored is rejected with a one-line reason (the codec's wording
where it applies), never dropped silently; a column of the wrong type fails the job
with a message naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from consumers.codecs.base import Decoded, DecodeError
from consumers.codecs.ctr import MAX_REQUEST_ID_CHARS, CtrCodec
from models.ctr import features as F
from pipeline.errors import UserError

FORMATS = ("parquet", "csv", "jsonl")
FEATURES = (*F.DENSE_FIELDS, *F.CAT_FIELDS)
REQUIRED = ("request_id", "item_id", *FEATURES)
OPTIONAL = ("timestamp_ms", "key")
_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_HEX_TOKEN = re.compile(r"[0-9a-fA-F]{1,16}\Z")
_HEX_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate("0123456789abcdef"):
    _HEX_LUT[ord(_c)] = _i
    _HEX_LUT[ord(_c.upper())] = _i
_NIBBLE_WEIGHTS = np.array([16 ** (7 - k) for k in range(8)], dtype=np.uint64)


class InputError(UserError):
    """An input the job cannot read at all (one line, names the file and column)."""


@dataclass
class Reject:
    offset: int  # row (or line) number in the input, or the Kafka offset
    reason: str
    value: Any  # the row as read, JSON-ready


@dataclass
class Features:
    """Model feeds and per-row metadata of the valid rows of one chunk."""

    dense: np.ndarray  # float32 [n, 13]
    cat: np.ndarray  # int64 [n, 26]
    request_id: pa.Array
    item_id: pa.Array
    item_pos: np.ndarray  # int32
    offset: np.ndarray  # int64: source offset of each row
    record_ts: pa.Array  # timestamp[ms, UTC], nullable
    part_ts: np.ndarray  # int64 ms: what places the row in date=/hour= directories
    key: pa.Array
    priority: pa.Array
    tenant: pa.Array

    @property
    def rows(self) -> int:
        return len(self.offset)


@dataclass
class Chunk:
    index: int
    first: int  # first offset the chunk covers
    next: int  # offset where the next chunk starts (what a checkpoint records)
    rows_in: int  # rows (or records) read
    features: Features
    rejects: list[Reject] = field(default_factory=list)
    fraction: float | None = None  # of the input consumed after this chunk, when known


# ----------------------------------------------------------------------------- detection
def detect_format(path: str, forced: str | None = None) -> str:
    if forced:
        return forced
    lower = path.lower()
    for ext, fmt in ((".parquet", "parquet"), (".pq", "parquet"), (".csv", "csv"),
                     (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl")):
        if lower.endswith(ext):
            return fmt
    raise InputError(f"input {path}: unknown format; name it .parquet, .csv or .jsonl (or pass --format)")


def expand_inputs(paths: Sequence[str], forced: str | None = None) -> list[str]:
    """Files named, and the supported files inside named directories (sorted)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            inside = sorted(
                os.path.join(p, n) for n in os.listdir(p)
                if not n.startswith((".", "_")) and _known(n, forced)
            )
            if not inside:
                raise InputError(f"input directory {p} holds no .parquet, .csv or .jsonl files")
            out.extend(inside)
        elif os.path.isfile(p):
            detect_format(p, forced)
            out.append(p)
        else:
            raise InputError(f"input not found: {p}")
    return out


def _known(name: str, forced: str | None) -> bool:
    try:
        detect_format(name, forced)
    except InputError:
        return False
    return True


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


# ----------------------------------------------------------------------------- file readers
def preflight(path: str, fmt: str) -> None:
    """Fail before any work when an input cannot be read or lacks a column."""
    source = os.path.basename(path)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            check_schema(pq.ParquetFile(path).schema_arrow, source)
        elif fmt == "csv":
            with open(path, "rb") as f:
                first = f.readline().decode("utf-8", "replace")
            names = [n.strip().strip('"') for n in first.rstrip("\r\n").split(",")]
            missing = next((c for c in REQUIRED if c not in names), None)
            if missing:
                raise InputError(f"input {source}: missing column {missing!r} (flat layout: docs/ETL.md)")
        else:
            with open(path, "rb") as f:
                f.read(1)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read input {path}: {_first_line(exc)}") from None


def file_record_time(path: str) -> int:
    """Record time of rows without timestamp_ms: the input file's modification time, so
    that a resumed job places rows where the first run did."""
    return os.stat(path).st_mtime_ns // 1_000_000


def read_file_chunks(path: str, fmt: str, chunk_rows: int, start: int) -> Iterator[Chunk]:
    """Chunks of `chunk_rows` input rows (lines for JSONL requests) from offset `start`
    (a chunk boundary recorded by a checkpoint)."""
    source = os.path.basename(path)
    fallback = file_record_time(path)
    if fmt == "parquet":
        yield from _flat_chunks(_parquet_tables(path, chunk_rows), chunk_rows, start, fallback, source)
    elif fmt == "csv":
        yield from _flat_chunks(_csv_tables(path), chunk_rows, start, fallback, source)
    else:
        yield from _jsonl_chunks(path, chunk_rows, start, fallback, source)


def _flat_chunks(
    tables: Iterator[_Block], chunk_rows: int, start: int, fallback: int, source: str
) -> Iterator[Chunk]:
    first = 0
    for index, block in enumerate(_rechunk(tables, chunk_rows)):
        nxt = first + block.table.num_rows
        if nxt > start:  # chunks before `start` were finished by an earlier run
            feats, rejects = featurize_flat(block.table, first, fallback, source)
            rejects = block.rejects + rejects
            yield Chunk(index, first, nxt, block.table.num_rows + len(block.rejects), feats, rejects, block.fraction)
        first = nxt


@dataclass
class _Block:
    table: pa.Table
    fraction: float | None = None  # of the input read so far
    rejects: list[Reject] = field(default_factory=list)  # lines the reader could not parse


def _rechunk(blocks: Iterator[_Block], rows: int) -> Iterator[_Block]:
    """Exactly `rows` rows per block (the last may be shorter), whatever the reader's
    own block sizes: chunk boundaries must not depend on how a file was read."""
    pending: list[pa.Table] = []
    rejects: list[Reject] = []
    have = 0
    fraction: float | None = None
    for block in blocks:
        pending.append(block.table)
        rejects.extend(block.rejects)
        fraction = block.fraction
        have += block.table.num_rows
        while have >= rows:
            merged = pa.concat_tables(pending)
            yield _Block(merged.slice(0, rows), fraction, rejects)
            rest = merged.slice(rows)
            pending, have, rejects = [rest], rest.num_rows, []
    if pending and (have or rejects):
        yield _Block(pa.concat_tables(pending), 1.0 if fraction is not None else None, rejects)


def _parquet_tables(path: str, chunk_rows: int) -> Iterator[_Block]:
    import pyarrow.parquet as pq

    try:
        # tokens arrive dictionary-encoded: parsed and hashed once per distinct value
        pf = pq.ParquetFile(path, read_dictionary=list(F.CAT_FIELDS))
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read input {path}: {_first_line(exc)}") from None
    check_schema(pf.schema_arrow, os.path.basename(path))
    wanted = [c for c in (*REQUIRED, *OPTIONAL) if c in pf.schema_arrow.names]
    total = max(pf.metadata.num_rows, 1)
    done = 0
    try:
        for batch in pf.iter_batches(batch_size=chunk_rows, columns=wanted, use_threads=False):
            done += batch.num_rows
            yield _Block(pa.Table.from_batches([batch]), done / total)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read input {path}: {_first_line(exc)}") from None


def _csv_tables(path: str) -> Iterator[_Block]:
    import pyarrow.csv as pcsv

    size = max(os.path.getsize(path), 1)
    ragged: list[Reject] = []

    def bad_line(row: Any) -> str:
        # A line with the wrong number of fields is a bad row: reject it, keep going.
        # Its offset is its line number (it never became a row).
        ragged.append(Reject(int(row.number or -1), f"CSV line has {row.actual_columns} fields, expected {row.expected_columns}", row.text[:1000]))
        return "skip"

    try:
        header = pcsv.open_csv(
            path,
            read_options=pcsv.ReadOptions(block_size=1 << 16),
            parse_options=pcsv.ParseOptions(invalid_row_handler=lambda _row: "skip"),  # names only
        ).schema.names
        wanted = [c for c in header if c in (*REQUIRED, *OPTIONAL)]
        reader = pcsv.open_csv(
            path,
            read_options=pcsv.ReadOptions(block_size=1 << 22, use_threads=False),
            parse_options=pcsv.ParseOptions(invalid_row_handler=bad_line),
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.string() for c in wanted if c != "timestamp_ms"},
                strings_can_be_null=True,
                include_columns=wanted,
            ),
        )
        check_schema(reader.schema, os.path.basename(path))
        done = 0
        for batch in reader:
            done += batch.nbytes
            block = _Block(pa.Table.from_batches([batch]), min(done / size, 0.99), list(ragged))
            ragged.clear()
            yield block
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read input {path}: {_first_line(exc)}") from None


def _jsonl_chunks(path: str, chunk_rows: int, start: int, fallback: int, source: str) -> Iterator[Chunk]:
    """JSONL: a chunk is `chunk_rows` lines. Flat rows are checked per value (JSON has
    types), then featurised like a table; request lines go through the CTR codec."""
    size = max(os.path.getsize(path), 1)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the generator may stop early
    except OSError as exc:
        raise InputError(f"cannot read input {path}: {exc.strerror}") from None
    try:
        kind: str | None = None
        first = 0
        index = 0
        while True:
            lines = [f.readline() for _ in range(chunk_rows)]
            lines = [line for line in lines if line]
            if not lines:
                return
            nxt = first + len(lines)
            if nxt > start:
                docs, rejects = _parse_lines(lines, first)
                kind = kind or next((_kind(d) for _, d in docs), None)
                if kind == "request":
                    feats = _request_features(docs, rejects, fallback)
                else:
                    feats = _flat_features(docs, rejects, first, fallback, source)
                rejects.sort(key=lambda r: r.offset)
                yield Chunk(index, first, nxt, len(lines), feats, rejects, min(f.tell() / size, 1.0))
            first = nxt
            index += 1
    finally:
        f.close()


def _kind(doc: dict[str, Any]) -> str:
    return "request" if "items" in doc else "flat"


def _parse_lines(lines: list[bytes], first: int) -> tuple[list[tuple[int, dict[str, Any]]], list[Reject]]:
    docs: list[tuple[int, dict[str, Any]]] = []
    rejects: list[Reject] = []
    for k, line in enumerate(lines):
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            rejects.append(Reject(first + k, f"malformed JSON: {exc.msg}", line.decode("utf-8", "replace")[:1000]))
            continue
        if type(doc) is not dict:
            rejects.append(Reject(first + k, "expected a JSON object", doc))
            continue
        docs.append((first + k, doc))
    return docs, rejects


def _request_features(docs: list[tuple[int, dict[str, Any]]], rejects: list[Reject], fallback: int) -> Features:
    codec = CtrCodec(max_items=1_000_000)  # a file is not bound by the worker's max_items
    ok: list[Decoded] = []
    offsets, keys, stamps = [], [], []
    for offset, doc in docs:
        try:
            d = codec.decode(orjson.dumps(doc))
        except DecodeError as exc:
            rejects.append(Reject(offset, str(exc), doc))
            continue
        ok.append(d)
        offsets.append(offset)
        user = doc.get("user_id")
        keys.append(user if isinstance(user, str) else None)
        ts = doc.get("timestamp_ms")
        stamps.append(ts if type(ts) is int else None)
    return features_from_requests(ok, offsets, keys, stamps, fallback)


def _flat_features(
    docs: list[tuple[int, dict[str, Any]]], rejects: list[Reject], first: int, fallback: int, source: str
) -> Features:
    """Flat JSON rows: JSON types are checked per value, then the table path takes over."""
    kept: list[tuple[int, dict[str, Any]]] = []
    for offset, doc in docs:
        reason = _flat_json_problem(doc)
        if reason:
            rejects.append(Reject(offset, reason, doc))
        else:
            kept.append((offset, doc))
    columns: dict[str, pa.Array] = {}
    for name in (*REQUIRED, *OPTIONAL):
        values = [doc.get(name) for _, doc in kept]
        if name in F.DENSE_FIELDS:
            columns[name] = pa.array(values, pa.float64())
        elif name == "timestamp_ms":
            columns[name] = pa.array(values, pa.int64())
        else:
            columns[name] = pa.array(values, pa.string())
    table = pa.table(columns)
    feats, more = featurize_flat(table, 0, fallback, source)
    # featurize_flat numbered rows 0..k-1 of the kept lines: map back to line numbers
    line_of = np.array([o for o, _ in kept], dtype=np.int64)
    feats.offset = line_of[feats.offset] if len(kept) else feats.offset
    rejects.extend(Reject(int(line_of[r.offset]), r.reason, r.value) for r in more)
    return feats


def _flat_json_problem(doc: dict[str, Any]) -> str | None:
    for name in ("request_id", "item_id", "key"):
        v = doc.get(name)
        if v is not None and type(v) is not str:
            return f"{name}: expected string, got {type(v).__name__}"
    for name in F.DENSE_FIELDS:
        v = doc.get(name)
        if v is not None and type(v) not in (int, float):
            return f"{name}: expected number or null, got {_json_type(v)}"
    for name in F.CAT_FIELDS:
        v = doc.get(name)
        if v is not None and type(v) is not str:
            return f"{name}: expected hex string or null, got {_json_type(v)}"
    ts = doc.get("timestamp_ms")
    if ts is not None and type(ts) is not int:
        return f"timestamp_ms: expected int, got {_json_type(ts)}"
    return None


def _json_type(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
