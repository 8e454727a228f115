"""Output of a `tidebatch etl` job: one scored chunk as Parquet files in the worker
sink's layout (pipeline/sinks/layout.py), one per record-time bucket, and its rejects
as JSON lines under `_rejects/`; named by the chunk, so a rerun rewrites them
identically. FeatureWriter writes ctr's item rows from whole columns; RequestWriter
any other pipeline's rows through the sink's own FileBuffer, so they are the rows the
worker's sink writes for that pipeline."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from consumers.records import SourceRecord
from models.registry import ModelSpec
from pipeline.etl.inputs import Chunk, Features, Reject
from pipeline.etl.settings import EtlJob
from pipeline.etl.sources import Source
from pipeline.sinks import ScoredRow
from pipeline.sinks import layout as L
from pipeline.sinks.storage import Storage

REJECTS_DIR = "_rejects"


class ChunkWriter:
    """One chunk's scored rows -> one Parquet file per record-time bucket, plus its
    rejects file (the codec's and the model's refusals); all named by the chunk, so a
    rerun overwrites them identically."""

    def __init__(self, storage: Storage, job: EtlJob, spec: ModelSpec) -> None:
        self.storage = storage
        self.job = job
        self.spec = spec
        self.inputs = L.input_fields(job.pipeline, job.columns)
        self.interval_ms = max(int(job.roll_interval_s * 1000), 1)

    def write(self, src: Source, chunk: Chunk, scored: Any) -> tuple[int, str | None]:
        """Returns (Parquet files written, the rejects file or None)."""
        files = self._write_rows(src, chunk, scored)
        rejects = sorted([*chunk.rejects, *scored.rejects], key=lambda r: r.offset)
        return files, self._put_rejects(src, chunk, rejects) if rejects else None

    def _write_rows(self, src: Source, chunk: Chunk, scored: Any) -> int:
        raise NotImplementedError

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

    def _put_rejects(self, src: Source, chunk: Chunk, rejects: list[Reject]) -> str:
        rel = f"{REJECTS_DIR}/{L.file_name(src.topic, src.partition, chunk.first)[:-len('.parquet')]}.jsonl"
        lines = (
            orjson.dumps({"offset": r.offset, "reason": r.reason, "value": r.value}, default=str)
            for r in rejects
        )
        self.storage.put(rel, b"\n".join(lines) + b"\n")
        return rel


class FeatureWriter(ChunkWriter):
    """ctr: item rows from the chunk's features and the scores, whole columns at once."""

    def _write_rows(self, src: Source, chunk: Chunk, scored: Any) -> int:
        feats: Features = chunk.payload
        if not feats.rows:
            return 0
        table = self._table(src, feats, scored.scores, scored.batch)
        files = 0
        for rows in self._buckets(feats.part_ts):
            part = _rows_of(table, rows)
            first, last = int(feats.offset[rows[0]]), int(feats.offset[rows[-1]])
            self._put(src, part, first, last, int(feats.part_ts[rows[0]]))
            files += 1
        return files

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


class RequestWriter(ChunkWriter):
    """Any other pipeline: each scored request as the worker's sink adds it to a file
    (pipeline/sinks/layout.py FileBuffer: its mode, result JSON, envelope columns and
    input columns), with the columns that describe one run of the worker (`late`,
    `scored_at`) null, as for ctr's etl rows. A file holds rows of one mode, as the sink's."""

    def _write_rows(self, src: Source, chunk: Chunk, scored: Any) -> int:
        reqs = chunk.payload
        done = [i for i, r in enumerate(scored.results) if r is not None]
        if not done:
            return 0
        rows = [self._row(src, reqs, i, scored.results[i], scored.batch_rows[i]) for i in done]
        modes = [L.row_mode(row.result) for row in rows]
        files = 0
        for bucket in self._buckets(reqs.part_ts[done]):
            for mode in dict.fromkeys(modes[k] for k in bucket):
                picked = [int(k) for k in bucket if modes[k] == mode]
                buf = L.FileBuffer(mode, self.job.pipeline, self.inputs)
                for k in picked:
                    buf.add(rows[k], *L.FileBuffer.measure(rows[k], mode, len(self.inputs)))
                first, last = rows[picked[0]].rec.offset, rows[picked[-1]].rec.offset
                self._put(src, buf.table({}), first, last, int(reqs.part_ts[done[picked[0]]]))
                files += 1
        return files

    def _row(self, src: Source, reqs: Any, i: int, result: dict[str, Any], batch_rows: int) -> ScoredRow:
        d = reqs.decoded[i]
        rec = SourceRecord(src.topic, src.partition, int(reqs.offset[i]), reqs.key[i], None, {}, reqs.record_ts[i])
        # The fields of the worker's result document (pipeline/scoring.py result_document)
        # that the sink's rows read, less the ones that describe when a worker ran.
        doc = {"request_id": d.request_id, **result, "model": self.spec.name, "model_version": self.spec.version,
               "batch_rows": batch_rows, "priority": d.priority}
        if d.tenant is not None:
            doc["tenant"] = d.tenant
        return ScoredRow(rec, d, doc, _no_ack)


def _no_ack() -> None:
    """Rows of a job are durable with their file; nothing waits for an ack."""


def _rows_of(table: Any, rows: np.ndarray) -> Any:
    """The table's rows at `rows` (ascending): a zero-copy slice when they are a
    contiguous run, as they are for time-ordered input."""
    if int(rows[-1]) - int(rows[0]) + 1 == len(rows):
        return table.slice(int(rows[0]), len(rows))
    return table.take(rows)
