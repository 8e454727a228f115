"""Input files of `tidebatch etl`: format detection (by name, or forced), the files
inside named directories, a preflight that fails before any work, and chunked readers
for Parquet, CSV and JSONL (flat rows, or one JSON request per line decoded by the
worker's codec). Chunk boundaries depend only on the input, never on how it was read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from models.ctr import features as F
from pipeline.codecs.base import Decoded, DecodeError
from pipeline.codecs.ctr import CtrCodec
from pipeline.etl.features import check_schema, features_from_requests, featurize_flat
from pipeline.etl.inputs import OPTIONAL, REQUIRED, Chunk, Features, InputError, Reject

FORMATS = ("parquet", "csv", "jsonl")


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
    types), then featurised like a table; request lines go through the CTR codec. The
    first line read decides which a file holds."""
    kind: str | None = None

    def payload(lines: list[bytes], first: int) -> tuple[Features, list[Reject]]:
        nonlocal kind
        docs, rejects = _parse_lines(lines, first)
        kind = kind or next((_kind(d) for _, d in docs), None)
        if kind == "request":
            return _request_features(docs, rejects, fallback), rejects
        return _flat_features(docs, rejects, first, fallback, source), rejects

    yield from line_chunks(path, chunk_rows, start, payload)


# A chunk's lines (and the line number of its first) -> its payload and rejects.
LinesPayload = Callable[[list[bytes], int], tuple[Any, list[Reject]]]


def line_chunks(path: str, chunk_rows: int, start: int, payload: LinesPayload) -> Iterator[Chunk]:
    """Chunks of `chunk_rows` lines of a text file from line `start` (a chunk boundary),
    each made by `payload`: CTR's JSONL here, any other pipeline's request lines in
    pipeline/etl/requests.py."""
    size = max(os.path.getsize(path), 1)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the generator may stop early
    except OSError as exc:
        raise InputError(f"cannot read input {path}: {exc.strerror}") from None
    try:
        first = 0
        index = 0
        while True:
            lines = [f.readline() for _ in range(chunk_rows)]
            lines = [line for line in lines if line]
            if not lines:
                return
            nxt = first + len(lines)
            if nxt > start:
                made, rejects = payload(lines, first)
                rejects.sort(key=lambda r: r.offset)
                yield Chunk(index, first, nxt, len(lines), made, rejects, min(f.tell() / size, 1.0))
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
