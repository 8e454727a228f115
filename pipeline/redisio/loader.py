"""Load user and item features from a CSV or Parquet file into Redis.

File layout (docs/REDIS.md "Loading features"): one row per entity,

    kind   "user" or "item"
    id     the user_id / item_id the requests carry
    I1 .. I13, C1 .. C26   any subset of the feature columns

A user row may set the context features (I1..I6, C1..C13), an item row the item
features (I7..I13, C14..C26); one file may hold both kinds, leaving the other kind's
cells empty. An empty cell (or null) is a missing feature. Dense values are numbers,
categorical values hex tokens ("68fd1e64"), as in an inline request.

Each row replaces its key (DEL + HSET), so a reload never leaves stale fields behind.
Rows go to Redis in pipelined chunks (one round trip per chunk).
"""

from __future__ import annotations

import csv
import gzip
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.ctr import features as F
from pipeline.errors import UserError
from pipeline.redisio.features import KIND_FIELDS, feature_key

ALL_FEATURES = frozenset(F.DENSE_FIELDS + F.CAT_FIELDS)
_KINDS = tuple(KIND_FIELDS)


@dataclass
class LoadStats:
    rows: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_KINDS, 0))
    seconds: float = 0.0


# ---------------------------------------------------------------------------- reading
def read_rows(path: Path, chunk_rows: int = 1000) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    """(columns, iterator of (where, row)) for a .csv, .csv.gz or .parquet file;
    `where` names the row in error messages ("line 7", "row 6")."""
    if not path.is_file():
        raise UserError(f"feature file not found: {path}")
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return _read_parquet(path, chunk_rows)
    if name.endswith((".csv", ".csv.gz")):
        return _read_csv(path)
    raise UserError(f"{path.name}: unknown format; use a .csv, .csv.gz or .parquet file")


def _read_csv(path: Path) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    f = opener(path, "rt", newline="", encoding="utf-8")
    reader = csv.DictReader(f)
    columns = list(reader.fieldnames or [])

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        with f:
            for row in reader:
                yield f"line {reader.line_num}", row

    return columns, rows()


def _read_parquet(path: Path, chunk_rows: int) -> tuple[list[str], Iterator[tuple[str, dict[str, Any]]]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise UserError(f"{path.name}: not a readable Parquet file: {str(exc).splitlines()[0]}") from None
    columns = list(pf.schema_arrow.names)

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        n = 0
        for batch in pf.iter_batches(batch_size=chunk_rows):
            for row in batch.to_pylist():
                n += 1
                yield f"row {n}", row

    return columns, rows()


def check_columns(columns: list[str], source: str) -> None:
    """The file must have kind and id, and only known feature columns besides."""
    missing = [c for c in ("kind", "id") if c not in columns]
    if missing:
        raise UserError(f"{source}: missing column {missing[0]!r}; the layout is kind, id, then I1..I13 / C1..C26")
    unknown = [c for c in columns if c not in ("kind", "id") and c not in ALL_FEATURES]
    if unknown:
        raise UserError(f"{source}: unknown column {unknown[0]!r}; feature columns are I1..I13 and C1..C26")


# ---------------------------------------------------------------------------- values
def _is_missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _dense_text(value: Any) -> str:
    """A dense value as stored: decimal text that float() reads back exactly."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got bool")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            raise ValueError("expected a finite number")
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, got {value!r}")
        return text
    raise ValueError(f"expected a number, got {type(value).__name__}")


def _token_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a hex string, got {type(value).__name__}")
    token = value.strip()
    try:
        F.parse_hex_tokens([token])
    except F.HexTokenError:
        raise ValueError(f"expected a hex string of 1..16 digits, got {value!r}") from None
    return token


def row_to_hash(row: dict[str, Any], where: str, prefix: str) -> tuple[str, str, dict[str, str]]:
    """(kind, key, fields) of one file row; UserError naming the row and column."""
    kind = row.get("kind")
    if kind not in KIND_FIELDS:
        raise UserError(f"{where}: kind: expected 'user' or 'item', got {kind!r}")
    entity = row.get("id")
    if _is_missing(entity) or isinstance(entity, bool):
        raise UserError(f"{where}: id: expected a non-empty id, got {entity!r}")
    entity_id = str(entity).strip() if not isinstance(entity, float) else str(int(entity))
    allowed = KIND_FIELDS[kind]
    fields: dict[str, str] = {}
    for column, value in row.items():
        if column in ("kind", "id") or _is_missing(value):
            continue
        if column not in allowed:
            first, last = allowed[0], allowed[-1]
            raise UserError(f"{where}: {column} is not a {kind} feature (a {kind} row sets {first}..{last} fields only)")
        try:
            fields[column] = _dense_text(value) if column.startswith("I") else _token_text(value)
        except ValueError as exc:
            raise UserError(f"{where}: {column}: {exc}") from None
    return kind, feature_key(prefix, kind, entity_id), fields


# ---------------------------------------------------------------------------- loading
def load_features(
    client: Any,
    path: Path,
    *,
    key_prefix: str = "tb:",
    chunk_rows: int = 1000,
    progress: Callable[[LoadStats], None] | None = None,
) -> LoadStats:
    """Validate and load every row of `path`; one pipeline (round trip) per chunk.
    Rows before an invalid row are already loaded (each row is self-contained)."""
    if chunk_rows < 1:
        raise UserError("--chunk-rows must be >= 1")
    columns, rows = read_rows(path, chunk_rows)
    check_columns(columns, path.name)
    stats = LoadStats()
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    pending = 0
    for where, row in rows:
        kind, key, fields = row_to_hash(row, f"{path.name} {where}", key_prefix)
        pipe.delete(key)
        if fields:  # a row without features is an absent key: a miss, all defaults
            pipe.hset(key, mapping=fields)
        stats.by_kind[kind] += 1
        pending += 1
        if pending >= chunk_rows:
            _send(pipe)
            stats.rows += pending
            pending = 0
            stats.seconds = time.perf_counter() - t0
            if progress:
                progress(stats)
    if pending:
        _send(pipe)
        stats.rows += pending
    stats.seconds = time.perf_counter() - t0
    return stats


def _send(pipe: Any) -> None:
    for result in pipe.execute(raise_on_error=False):
        if isinstance(result, Exception):
            raise UserError(f"Redis refused a write: {result}")
