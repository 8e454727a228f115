"""The offline Parquet layout shared by the worker's sink and `tidebatch etl`
(docs/ETL.md): directory partitioning, file names, the columns and how scored rows
become an Arrow table.

    <root>/model=<model>/date=YYYY-MM-DD/hour=HH/<topic>+<partition>+<first offset>.parquet

`model`, `date` and `hour` are Hive partition directories and therefore not columns
inside the files (readers add them from the path; a column of the same name in the
file makes pyarrow refuse the dataset). date/hour come from the record time of the
file's first row, in UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from models.ctr import features as F
from pipeline.errors import UserError
from pipeline.sinks import ScoredRow

SCHEMA_VERSION = "1"
OFFSET_WIDTH = 10  # Kafka Connect's default zero padding: names sort by offset
STATE_DIR = "_state"  # per topic-partition sink state (underscore: readers skip it)
HOUR_MS = 3_600_000

ITEMS = "items"  # one row per scored item (CTR)
REQUESTS = "requests"  # one row per request (camera frames, texts)

_TS = pa.timestamp("ms", tz="UTC")
_ITEM_FIELDS = [
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("item_id", pa.string()),
    pa.field("item_pos", pa.int32()),  # position of the item in its request
    pa.field("score", pa.float32()),
]
_REQUEST_FIELDS = [
    pa.field("request_id", pa.string(), nullable=False),
    pa.field("result", pa.string()),  # the codec's result fields as JSON (e.g. detections)
]
_META_FIELDS = [
    pa.field("key", pa.string()),
    pa.field("model_version", pa.string()),
    pa.field("tenant", pa.string()),
    pa.field("priority", pa.int32()),
    pa.field("late", pa.bool_()),
    pa.field("batch_rows", pa.int32()),
    pa.field("record_ts", _TS),  # Kafka timestamp (or the input file's record time)
    pa.field("scored_at", _TS),
    pa.field("source_topic", pa.string()),
    pa.field("source_partition", pa.int32()),
    pa.field("source_offset", pa.int64()),
]
# Fields of the result document that are envelope, not the codec's own result.
_ENVELOPE = frozenset({
    "request_id", "key", "model", "model_version", "batch_rows", "queue_wait_ms",
    "inference_ms", "kafka_ts_ms", "scored_at_ms", "priority", "late", "source",
    "tenant", "duplicate",
})


# ----------------------------------------------------------------------------- naming
def file_name(topic: str, partition: int, first_offset: int) -> str:
    return f"{topic}+{partition}+{first_offset:0{OFFSET_WIDTH}d}.parquet"


def partition_dir(model: str, record_ms: int) -> str:
    t = dt.datetime.fromtimestamp(record_ms / 1000.0, tz=dt.UTC)
    return f"model={model}/date={t:%Y-%m-%d}/hour={t:%H}"


def state_path(model: str, topic: str, partition: int) -> str:
    return f"{STATE_DIR}/model={model}/{topic}+{partition}.json"


def bucket_of(record_ms: int, interval_ms: int) -> tuple[int, int]:
    """Record-time bucket of a row: (hour, interval slot). A file never spans two, so
    a file's directory (its first row's hour) is right for every row in it."""
    return record_ms // HOUR_MS, record_ms // interval_ms


# ----------------------------------------------------------------------------- inputs
def input_fields(pipeline: str, names: Sequence[str]) -> list[pa.Field]:
    """Arrow fields of the configured input columns; UserError naming an unknown one.
    CTR: I1..I13 are the raw counts (float32, null = missing); C1..C26 the hashed ids
    the model sees (int64, null = missing) — the hex tokens are not kept by the codec."""
    fields = []
    for name in names:
        if pipeline == "ctr":
            if name in F.DENSE_FIELDS:
                fields.append(pa.field(name, pa.float32()))
            elif name in F.CAT_FIELDS:
                fields.append(pa.field(name, pa.int64()))
            else:
                raise UserError(
                    f"config key 'sinks.parquet.columns': {name!r} is not a CTR feature (I1..I13, C1..C26)"
                )
        else:
            fields.append(pa.field(name, pa.string()))  # decoded.extra[name] as JSON
    return fields


def schema(mode: str, inputs: Sequence[pa.Field], metadata: Mapping[str, str] | None = None) -> pa.Schema:
    head = _ITEM_FIELDS if mode == ITEMS else _REQUEST_FIELDS
    meta = {"tidebatch.schema_version": SCHEMA_VERSION, "tidebatch.mode": mode, **(metadata or {})}
    return pa.schema([*head, *_META_FIELDS, *inputs], metadata=meta)


def row_mode(result: Mapping[str, Any]) -> str:
    return ITEMS if "scores" in result and "item_ids" in result else REQUESTS


def ctr_inputs(dense: np.ndarray, cat: np.ndarray, fields: Sequence[pa.Field]) -> dict[str, pa.Array]:
    """Input columns from the model feeds of many rows (vectorised)."""
    out: dict[str, pa.Array] = {}
    for f in fields:
        if f.name in F.DENSE_FIELDS:
            col = dense[:, F.DENSE_FIELDS.index(f.name)]
            out[f.name] = pa.array(col, pa.float32(), mask=np.isnan(col))
        else:
            j = F.CAT_FIELDS.index(f.name)
            col = cat[:, j]
            out[f.name] = pa.array(col, pa.int64(), mask=col == F.MISSING_IDS[j])
    return out


def features_table(
    cols: Mapping[str, Any],
    dense: np.ndarray,
    cat: np.ndarray,
    inputs: Sequence[pa.Field],
    metadata: Mapping[str, str],
) -> pa.Table:
    """An items-mode table from whole columns (`tidebatch etl`): `cols` holds every
    non-input column as an Arrow array, numpy array or scalar (repeated); the inputs
    come from the model feeds."""
    sch = schema(ITEMS, inputs, metadata)
    n = len(dense)
    arrays = []
    values = {**cols, **ctr_inputs(dense, cat, inputs)}
    for f in sch:
        v = values.get(f.name)
        if v is None:
            arrays.append(pa.nulls(n, f.type))
        elif isinstance(v, pa.Array | np.ndarray):
            arrays.append(v.cast(f.type) if isinstance(v, pa.Array) else pa.array(v, f.type))
        else:
            arrays.append(pa.repeat(pa.scalar(v, f.type), n))
    return pa.table(arrays, schema=sch)


# ----------------------------------------------------------------------------- buffer
class FileBuffer:
    """Columns of one file, filled request by request in offset order (the worker's
    sink), turned into one Arrow table when the file is finished."""

    _FIXED_ROW_BYTES = 64  # fixed-width columns of one row, for the size estimate

    def __init__(self, mode: str, pipeline: str, inputs: Sequence[pa.Field]) -> None:
        self.mode = mode
        self.pipeline = pipeline
        self.inputs = list(inputs)
        self.rows = 0
        self.est_bytes = 0
        self.lengths: list[int] = []
        self.req: dict[str, list[Any]] = {f.name: [] for f in _META_FIELDS}
        self.request_ids: list[str] = []
        self.item_ids: list[str] = []
        self.scores: list[float] = []
        self.results: list[str] = []
        self.feeds: list[Any] = []  # per request: (dense, cat) for CTR, extra dict otherwise

    @staticmethod
    def measure(row: ScoredRow, mode: str, n_inputs: int) -> tuple[int, int]:
        """(rows, estimated bytes) this request adds: from the record and the scores
        only, never from timing, so the same records always cut files the same way."""
        res = row.result
        rid = len(row.decoded.request_id)
        key = len(row.rec.key) if row.rec.key else 0
        if mode == ITEMS:
            n = len(res["item_ids"])
            per_row = FileBuffer._FIXED_ROW_BYTES + rid + key + 8 * n_inputs
            return n, n * per_row + sum(map(len, res["item_ids"]))
        size = FileBuffer._FIXED_ROW_BYTES + rid + key + 8 * n_inputs + len(_result_json(res))
        return 1, size

    def add(self, row: ScoredRow, n: int, size: int) -> None:
        res = row.result
        rec = row.rec
        self.rows += n
        self.est_bytes += size
        self.lengths.append(n)
        self.request_ids.append(row.decoded.request_id)  # camera results carry none of their own
        if self.mode == ITEMS:
            self.item_ids.extend(res["item_ids"])
            self.scores.extend(res["scores"])
        else:
            self.results.append(_result_json(res))
        r = self.req
        r["key"].append(rec.key.decode("utf-8", "replace") if rec.key is not None else None)
        r["model_version"].append(res.get("model_version"))
        r["tenant"].append(res.get("tenant"))
        r["priority"].append(res.get("priority"))
        r["late"].append(res.get("late"))
        r["batch_rows"].append(res.get("batch_rows"))
        r["record_ts"].append(rec.timestamp_ms)
        r["scored_at"].append(res.get("scored_at_ms"))
        r["source_topic"].append(rec.topic)
        r["source_partition"].append(rec.partition)
        r["source_offset"].append(rec.offset)
        if self.inputs:
            payload = row.decoded.payload
            if self.pipeline == "ctr":
                self.feeds.append((payload.dense, payload.cat))
            else:
                self.feeds.append(row.decoded.extra)

    def table(self, metadata: Mapping[str, str]) -> pa.Table:
        lengths = np.asarray(self.lengths, dtype=np.int64)
        # Request-level values repeat once per item row: one vectorised take.
        take = pa.array(np.repeat(np.arange(len(lengths)), lengths))
        cols: dict[str, pa.Array] = {}
        sch = schema(self.mode, self.inputs, metadata)
        cols["request_id"] = pa.array(self.request_ids, pa.string()).take(take)
        if self.mode == ITEMS:
            starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
            cols["item_id"] = pa.array(self.item_ids, pa.string())
            cols["item_pos"] = pa.array((np.arange(self.rows) - starts).astype(np.int32))
            cols["score"] = pa.array(self.scores, pa.float32())
        else:
            cols["result"] = pa.array(self.results, pa.string())
        for f in _META_FIELDS:
            cols[f.name] = pa.array(self.req[f.name], f.type).take(take)
        cols.update(self._input_columns(take))
        return pa.table([cols[f.name] for f in sch], schema=sch)

    def _input_columns(self, take: pa.Array) -> dict[str, pa.Array]:
        if not self.inputs:
            return {}
        if self.pipeline == "ctr":
            dense = np.concatenate([d for d, _ in self.feeds])
            cat = np.concatenate([c for _, c in self.feeds])
            return ctr_inputs(dense, cat, self.inputs)
        out = {}
        for f in self.inputs:
            values = [_json_or_none(extra.get(f.name)) for extra in self.feeds]
            out[f.name] = pa.array(values, pa.string()).take(take)
        return out


def _result_json(result: Mapping[str, Any]) -> str:
    own = {k: v for k, v in result.items() if k not in _ENVELOPE}
    return orjson.dumps(own, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()


def _json_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY).decode()


# ----------------------------------------------------------------------------- encoding
# Dictionary pages only where values repeat (ids of a request's items, keys, constants):
# smaller files, and a third less encoding time than dictionary-encoding every column.
_DICTIONARY = ["request_id", "item_id", "key", "model_version", "tenant", "source_topic"]
# Min/max statistics where readers prune on them (time, offsets, scores).
_STATISTICS = ["record_ts", "scored_at", "source_partition", "source_offset", "score", "batch_rows", "late"]


def encode(table: pa.Table, compression: str) -> bytes:
    """The whole Parquet file in memory: written to storage in one atomic put."""
    out = pa.BufferOutputStream()
    names = set(table.column_names)
    pq.write_table(
        table,
        out,
        compression=None if compression == "none" else compression,
        use_dictionary=[c for c in _DICTIONARY if c in names],
        write_statistics=[c for c in _STATISTICS if c in names],
    )
    return out.getvalue().to_pybytes()
