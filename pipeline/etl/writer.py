"""Output of a `tidebatch etl` job: one scored chunk as Parquet files in the worker
sink's layout (pipeline/sinks/layout.py), one per record-time bucket, and its rejects
as JSON lines under `_rejects/`; named by the chunk, so a rerun rewrites them
identically."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from models.registry import ModelSpec
from pipeline.etl.inputs import Chunk, Features
from pipeline.etl.settings import EtlJob
from pipeline.etl.sources import Source
from pipeline.sinks import layout as L
from pipeline.sinks.storage import Storage

REJECTS_DIR = "_rejects"


class ChunkWriter:
    """One chunk's scored rows -> one Parquet file per record-time bucket, plus its
    rejects file; all named by the chunk, so a rerun overwrites them identically."""

    def __init__(self, storage: Storage, job: EtlJob, spec: ModelSpec) -> None:
        self.storage = storage
        self.job = job
        self.spec = spec
        self.inputs = L.input_fields(job.pipeline, job.columns)
        self.interval_ms = max(int(job.roll_interval_s * 1000), 1)

    def write(self, src: Source, chunk: Chunk, scores: np.ndarray, batch: np.ndarray) -> tuple[int, str | None]:
        """Returns (Parquet files written, the rejects file or None)."""
        feats = chunk.features
        files = 0
        if feats.rows:
            table = self._table(src, feats, scores, batch)
            for rows in self._buckets(feats.part_ts):
                part = _rows_of(table, rows)
                first, last = int(feats.offset[rows[0]]), int(feats.offset[rows[-1]])
                self._put(src, part, first, last, int(feats.part_ts[rows[0]]))
                files += 1
        rejects = self._put_rejects(src, chunk) if chunk.rejects else None
        return files, rejects

    def _buckets(self, ts: np.ndarray) -> list[np.ndarray]:
        """Row indices per record-time bucket (a file never spans two, as in the sink)."""
        lo, hi = int(ts.min()), int(ts.max())
        if L.bucket_of(lo, self.interval_ms) == L.bucket_of(hi, self.interval_ms):
            return [np.arange(len(ts))]  # the usual chunk: no sorting at all
        hour, slot = ts // L.HOUR_MS, ts // self.interval_ms
        span = int(slot.max() - slot.min()) + 1
        key = (hour - hour.min()) * span + (slot - slot.min())  # one int per (hour, slot)
        if np.all(key[1:] >= key[:-1]):  # time-ordered input: buckets are runs
            cuts = [0, *(np.flatnonzero(np.diff(key)) + 1).tolist(), len(ts)]
            return [np.arange(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
        uniq, inverse = np.unique(key, return_inverse=True)
        return [np.flatnonzero(inverse == b) for b in range(len(uniq))]

    def _table(self, src: Source, feats: Features, scores: np.ndarray, batch: np.ndarray) -> Any:
        cols = {
            "request_id": feats.request_id,
            "item_id": feats.item_id,
            "item_pos": feats.item_pos,
            "score": scores,
            "key": feats.key,
            "model_version": self.spec.version,
            "tenant": feats.tenant,
            "priority": feats.priority,
            "batch_rows": batch,
            "record_ts": feats.record_ts,
            "source_topic": src.topic,
            "source_partition": src.partition,
            "source_offset": feats.offset,
        }
        return L.features_table(cols, feats.dense, feats.cat, self.inputs, {})

    def _put(self, src: Source, table: Any, first: int, last: int, ts: int) -> None:
        meta = {
            **(table.schema.metadata or {}),
            b"tidebatch.model": self.spec.name.encode(),
            b"tidebatch.topic": src.topic.encode(),
            b"tidebatch.partition": str(src.partition).encode(),
            b"tidebatch.first_offset": str(first).encode(),
            b"tidebatch.last_offset": str(last).encode(),
        }
        data = L.encode(table.replace_schema_metadata(meta), self.job.compression)
        rel = f"{L.partition_dir(self.spec.name, ts)}/{L.file_name(src.topic, src.partition, first)}"
        self.storage.put(rel, data)

    def _put_rejects(self, src: Source, chunk: Chunk) -> str:
        rel = f"{REJECTS_DIR}/{L.file_name(src.topic, src.partition, chunk.first)[:-len('.parquet')]}.jsonl"
        lines = (
            orjson.dumps({"offset": r.offset, "reason": r.reason, "value": r.value}, default=str)
            for r in chunk.rejects
        )
        self.storage.put(rel, b"\n".join(lines) + b"\n")
        return rel


def _rows_of(table: Any, rows: np.ndarray) -> Any:
    """The table's rows at `rows` (ascending): a zero-copy slice when they are a
    contiguous run, as they are for time-ordered input."""
    if int(rows[-1]) - int(rows[0]) + 1 == len(rows):
        return table.slice(int(rows[0]), len(rows))
    return table.take(rows)
