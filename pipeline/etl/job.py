"""`tidebatch etl`: a bounded job that scores CTR requests from files or from a Kafka
topic range in large batches and writes the worker sink's Parquet layout
(pipeline/sinks/layout.py, docs/ETL.md).

Work is cut into chunks whose boundaries depend only on the input (N rows of a file,
N offsets of a partition). Each chunk is scored in batches of `batch_rows` rows per
ONNX Runtime call and written as one file per record-time bucket, named by its first
offset, atomically. Then the chunk is recorded in `_etl/checkpoint.json`. A resumed
job skips recorded chunks and rewrites the chunk it was in (same names, same bytes),
so it ends with the files of an uninterrupted run. Nothing in a file depends on when
or in what order the job ran: `scored_at` and `late` are null for ETL rows.

Throughput: reading and featurising the next chunk (vectorised Arrow/numpy, main
thread) and writing the previous one overlap with ONNX Runtime scoring the current one
(a second thread; ORT releases the GIL).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import orjson

from models.registry import ModelSpec, load_spec
from pipeline.errors import UserError
from pipeline.etl.inputs import (
    Chunk,
    Features,
    detect_format,
    expand_inputs,
    preflight,
    read_file_chunks,
)
from pipeline.sinks import layout as L
from pipeline.sinks.storage import Storage, open_storage

CHECKPOINT = "_etl/checkpoint.json"
REJECTS_DIR = "_rejects"
_PROGRESS_TTY_S = 0.25
_PROGRESS_LOG_S = 5.0


@dataclass
class EtlJob:
    output: str
    inputs: list[str] = field(default_factory=list)  # files mode
    fmt: str | None = None  # force parquet | csv | jsonl
    topic: str | None = None  # topic mode
    bootstrap_servers: str | None = None
    broker_profile: str = "kafka"
    partitions: list[int] | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    from_ms: int | None = None
    to_ms: int | None = None
    pipeline: str = "ctr"
    columns: list[str] = field(default_factory=list)
    chunk_rows: int = 131_072  # rows of an input file per chunk (and at most per output file)
    chunk_records: int = 8192  # offsets of a partition per chunk (~160k rows of CTR requests)
    # Rows per ONNX Runtime call. Measured for the CTR model on this 2-core EPYC (1 MiB L2
    # per core): ~120k rows per CPU-second at 512-2048 rows, ~96k at 8192 (the 8192 x 256
    # activations spill out of L2), so the default is the largest size before the drop.
    batch_rows: int = 2048
    roll_interval_s: float = 300.0
    compression: str = "zstd"
    providers: str = "auto"
    threads: int = 1
    progress: bool = True
    stop_after_chunks: int | None = None  # test hook: raise JobInterrupted after N chunks


class JobInterrupted(BaseException):
    """The stop_after_chunks test hook: a crash at a chunk boundary. BaseException so
    that nothing on the way mistakes it for a failure to report."""


@dataclass
class EtlSummary:
    rows_in: int = 0  # input rows (file rows, JSONL lines, Kafka records), whole job
    rows_scored: int = 0  # scored item rows, this run
    total_scored: int = 0  # scored item rows, whole job
    rejected: int = 0
    files: int = 0
    chunks_done: int = 0
    chunks_skipped: int = 0
    seconds: float = 0.0
    provider: str = ""
    rejects_files: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows_scored / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Source:
    """One unit of input: a file, or one partition of the topic range."""

    id: str  # checkpoint key
    topic: str  # the file name or the Kafka topic (names output files)
    partition: int
    weight: float  # share of the whole job, for progress
    chunks: Callable[[int], Iterator[Chunk]]  # resume offset -> chunks
    start: int = 0


def validate_job(job: EtlJob) -> None:
    if bool(job.inputs) == bool(job.topic):
        raise UserError("give input files or --topic (one of them)")
    if job.pipeline != "ctr":
        raise UserError(f"etl scores CTR requests only, not the {job.pipeline!r} pipeline")
    limits = (("--chunk-rows", job.chunk_rows), ("--chunk-records", job.chunk_records),
              ("--batch-rows", job.batch_rows), ("--threads", job.threads))
    for name, value in limits:
        if value < 1:
            raise UserError(f"{name} must be >= 1")
    if job.roll_interval_s <= 0:
        raise UserError("--roll-interval-s must be > 0")
    if job.topic and not job.bootstrap_servers:
        raise UserError("--topic needs --bootstrap-servers")
    if job.from_offset is not None and job.from_ms is not None:
        raise UserError("give --from-offset or --from-time, not both")
    if job.to_offset is not None and job.to_ms is not None:
        raise UserError("give --to-offset or --to-time, not both")


# ----------------------------------------------------------------------------- sources
def _file_sources(job: EtlJob) -> tuple[list[_Source], list[dict[str, Any]]]:
    paths = expand_inputs(job.inputs, job.fmt)
    names = [os.path.basename(p) for p in paths]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise UserError(f"two inputs are named {dup!r}: output files are named by input file name")
    sources, ident = [], []
    for path in paths:
        fmt = detect_format(path, job.fmt)
        preflight(path, fmt)
        st = os.stat(path)
        name = os.path.basename(path)

        def chunks(start: int, path: str = path, fmt: str = fmt) -> Iterator[Chunk]:
            return read_file_chunks(path, fmt, job.chunk_rows, start)

        sources.append(_Source(name, name, 0, float(max(st.st_size, 1)), chunks))
        ident.append({"name": name, "path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return sources, ident


def _topic_sources(job: EtlJob, saved: list[dict[str, Any]] | None) -> tuple[list[_Source], list[dict[str, Any]]]:
    from consumers.codecs.ctr import CtrCodec
    from pipeline.etl.topic import PartitionRange, read_partition_chunks, resolve_ranges

    assert job.topic is not None and job.bootstrap_servers is not None
    if saved is not None:  # resumed: the ranges fixed when the job was created
        ranges = [PartitionRange(**r) for r in saved]
    else:
        ranges = resolve_ranges(
            job.bootstrap_servers, job.broker_profile, job.topic, job.partitions,
            job.from_offset, job.to_offset, job.from_ms, job.to_ms,
        )
    codec = CtrCodec(max_items=1_000_000)
    sources = []
    for rng in ranges:

        def chunks(start: int, rng: PartitionRange = rng) -> Iterator[Chunk]:
            assert job.bootstrap_servers is not None
            return read_partition_chunks(job.bootstrap_servers, job.broker_profile, rng, job.chunk_records, start, codec)

        sources.append(_Source(f"{rng.topic}+{rng.partition}", rng.topic, rng.partition,
                               float(max(rng.end - rng.start, 1)), chunks, rng.start))
    return sources, [r.as_dict() for r in ranges]


# ----------------------------------------------------------------------------- checkpoint
class Checkpoint:
    """`_etl/checkpoint.json` in the output: the job's identity and, per source, where
    the next unfinished chunk starts and the totals so far. Rewritten atomically after
    every chunk whose files are durable."""

    def __init__(self, storage: Storage, identity: dict[str, Any]) -> None:
        self.storage = storage
        self.identity = identity
        self.sources: dict[str, dict[str, Any]] = {}
        self.resumed = False

    @staticmethod
    def saved_identity(storage: Storage) -> dict[str, Any] | None:
        raw = storage.get(CHECKPOINT)
        if raw is None:
            return None
        try:
            return json.loads(raw)["job"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{storage.root}/{CHECKPOINT} is unreadable; delete it to start the job over") from None

    def load(self) -> None:
        raw = self.storage.get(CHECKPOINT)
        if raw is None:
            return
        doc = json.loads(raw)
        if doc["job"] != self.identity:
            raise UserError(
                f"output {self.storage.root} holds a different job ({_difference(doc['job'], self.identity)}); "
                "use another --output, or delete its _etl/checkpoint.json to start over"
            )
        self.sources = doc.get("sources", {})
        self.resumed = True

    def get(self, source_id: str) -> dict[str, Any]:
        return self.sources.setdefault(
            source_id, {"next": None, "chunks": 0, "rows_in": 0, "rows_scored": 0, "rejected": 0, "files": 0, "done": False}
        )

    def save(self) -> None:
        doc = {"version": 1, "job": self.identity, "sources": self.sources}
        self.storage.put(CHECKPOINT, json.dumps(doc, indent=1, sort_keys=True).encode())


def _difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    key = next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)), "?")
    return f"{key} differs"


# ----------------------------------------------------------------------------- scoring
class Scorer:
    """ONNX Runtime over a chunk, `batch_rows` rows per call."""

    def __init__(self, spec: ModelSpec, providers: str, threads: int, batch_rows: int) -> None:
        from pipeline.runtime.session import InferenceSession

        self.session = InferenceSession(spec.onnx_path, providers, threads)
        self.batch_rows = batch_rows

    def score(self, feats: Features) -> tuple[np.ndarray, np.ndarray]:
        n = feats.rows
        scores = np.empty(n, dtype=np.float32)
        batch = np.empty(n, dtype=np.int32)
        for i in range(0, n, self.batch_rows):
            j = min(i + self.batch_rows, n)
            out = self.session.run({"dense": feats.dense[i:j], "cat": feats.cat[i:j]})
            scores[i:j] = np.asarray(out["prob"]).reshape(-1)
            batch[i:j] = j - i
        return scores, batch


# ----------------------------------------------------------------------------- writing
class ChunkWriter:
    """One chunk's scored rows -> one Parquet file per record-time bucket, plus its
    rejects file; all named by the chunk, so a rerun overwrites them identically."""

    def __init__(self, storage: Storage, job: EtlJob, spec: ModelSpec) -> None:
        self.storage = storage
        self.job = job
        self.spec = spec
        self.inputs = L.input_fields(job.pipeline, job.columns)
        self.interval_ms = max(int(job.roll_interval_s * 1000), 1)

    def write(self, src: _Source, chunk: Chunk, scores: np.ndarray, batch: np.ndarray) -> tuple[int, str | None]:
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

    def _table(self, src: _Source, feats: Features, scores: np.ndarray, batch: np.ndarray) -> Any:
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

    def _put(self, src: _Source, table: Any, first: int, last: int, ts: int) -> None:
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

    def _put_rejects(self, src: _Source, chunk: Chunk) -> str:
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


# ----------------------------------------------------------------------------- progress
class Progress:
    """rows/s and ETA on stderr: redrawn in place on a terminal, a line every few
    seconds otherwise (logs, CI)."""

    def __init__(self, enabled: bool, out: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.out.isatty()
        self.t0 = time.monotonic()
        self.f0 = 0.0  # share of the job finished before this run (resumed jobs)
        self.last = 0.0
        self.finished = False

    def update(self, rows: int, fraction: float, final: bool = False) -> None:
        if not self.enabled or self.finished:
            return
        now = time.monotonic()
        final = final or fraction >= 1.0
        if not final and now - self.last < (_PROGRESS_TTY_S if self.tty else _PROGRESS_LOG_S):
            return
        self.finished = final
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        rate = rows / elapsed
        gained = fraction - self.f0
        eta = elapsed * (1.0 - fraction) / gained if gained > 0 else float("nan")
        line = f"etl: {fraction:6.1%} {rows:>12,} rows {rate:>10,.0f} rows/s ETA {_clock(eta)}"
        if self.tty:
            self.out.write("\r" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _clock(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "--:--"
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


# ----------------------------------------------------------------------------- the job
def run_etl(job: EtlJob, progress_out: TextIO | None = None) -> EtlSummary:
    """Run (or resume) the job; UserError with a one-line reason on failure."""
    validate_job(job)
    spec = load_spec(job.pipeline)
    storage = open_storage(job.output)
    L.input_fields(job.pipeline, job.columns)  # unknown column names fail before any work
    saved = Checkpoint.saved_identity(storage)
    if job.topic:
        saved_ranges = saved.get("sources") if saved and saved.get("mode") == "topic" else None
        sources, ident = _topic_sources(job, saved_ranges)
    else:
        sources, ident = _file_sources(job)
    identity = _identity(job, spec, ident)
    checkpoint = Checkpoint(storage, identity)
    checkpoint.load()
    scorer = Scorer(spec, job.providers, job.threads, job.batch_rows)
    writer = ChunkWriter(storage, job, spec)
    summary = EtlSummary(provider=scorer.session.provider)
    progress = Progress(job.progress, progress_out)
    t0 = time.monotonic()
    try:
        _Runner(checkpoint, scorer, writer, summary, progress, job.stop_after_chunks).run(sources)
    except OSError as exc:
        raise UserError(f"cannot write output {job.output}: {exc.strerror or exc}") from None
    summary.seconds = time.monotonic() - t0
    _totals(checkpoint, summary)
    progress.update(summary.rows_scored, 1.0, final=True)
    return summary


def _identity(job: EtlJob, spec: ModelSpec, sources: list[dict[str, Any]]) -> dict[str, Any]:
    """What makes two runs the same job: inputs, model and every setting that changes
    file contents or chunk boundaries."""
    ident = {
        "mode": "topic" if job.topic else "files",
        "model": spec.name,
        "model_version": spec.version,
        "model_sha256": spec.raw.get("sha256") or _file_sha256(spec.onnx_path),
        "columns": list(job.columns),
        "chunk": job.chunk_records if job.topic else job.chunk_rows,
        "batch_rows": job.batch_rows,
        "roll_interval_s": job.roll_interval_s,
        "compression": job.compression,
        "sources": sources,
    }
    if job.topic:
        ident["request"] = {
            "topic": job.topic, "partitions": job.partitions, "from_offset": job.from_offset,
            "to_offset": job.to_offset, "from_ms": job.from_ms, "to_ms": job.to_ms,
        }
    return json.loads(json.dumps(ident))  # the same types a reloaded checkpoint has


def _file_sha256(path: Any) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()  # noqa: SIM115


class _Runner:
    """Drives the sources chunk by chunk: scoring of chunk k (pool thread) overlaps
    with reading chunk k+1 and writing chunk k-1 (this thread)."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        scorer: Scorer,
        writer: ChunkWriter,
        summary: EtlSummary,
        progress: Progress,
        stop_after: int | None,
    ) -> None:
        self.checkpoint = checkpoint
        self.scorer = scorer
        self.writer = writer
        self.summary = summary
        self.progress = progress
        self.stop_after = stop_after
        self.total_weight = 1.0
        self.done_weight = 0.0

    def run(self, sources: list[_Source]) -> None:
        self.total_weight = sum(s.weight for s in sources) or 1.0
        before = sum(s.weight * self.checkpoint.get(s.id).get("fraction", 0.0) for s in sources)
        self.progress.f0 = before / self.total_weight
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="etl-score") as pool:
            for src in sources:
                self._run_source(src, pool)
                self.done_weight += src.weight

    def _run_source(self, src: _Source, pool: ThreadPoolExecutor) -> None:
        state = self.checkpoint.get(src.id)
        self.summary.chunks_skipped += state["chunks"]
        if state["done"]:
            return
        resume = state["next"] if state["next"] is not None else src.start
        inflight: deque[tuple[Chunk, Future[tuple[np.ndarray, np.ndarray]]]] = deque()
        for chunk in src.chunks(resume):
            inflight.append((chunk, pool.submit(self.scorer.score, chunk.features)))
            if len(inflight) > 1:
                self._finish(src, state, *inflight.popleft())
        while inflight:
            self._finish(src, state, *inflight.popleft())
        state["done"] = True
        state["fraction"] = 1.0
        self.checkpoint.save()

    def _finish(self, src: _Source, state: dict[str, Any], chunk: Chunk, fut: Future[Any]) -> None:
        """Write a scored chunk, then record it: the checkpoint never runs ahead of files."""
        scores, batch = fut.result()
        files, rejects = self.writer.write(src, chunk, scores, batch)
        _record(state, chunk, files, rejects, self.summary)
        state["fraction"] = chunk.fraction or 0.0  # for progress after a resume
        self.checkpoint.save()
        frac = (self.done_weight + src.weight * (chunk.fraction or 0.0)) / self.total_weight
        self.progress.update(self.summary.rows_scored, frac)
        if self.stop_after is not None and self.summary.chunks_done >= self.stop_after:
            raise JobInterrupted(f"stopped after {self.stop_after} chunks (test hook)")


def _record(state: dict[str, Any], chunk: Chunk, files: int, rejects: str | None, summary: EtlSummary) -> None:
    state["next"] = chunk.next
    state["chunks"] += 1
    state["rows_in"] += chunk.rows_in
    state["rows_scored"] += chunk.features.rows
    state["rejected"] += len(chunk.rejects)
    state["files"] += files
    if rejects:
        state.setdefault("rejects_files", []).append(rejects)
    summary.chunks_done += 1
    summary.rows_scored += chunk.features.rows  # this run only; totals come at the end


def _totals(checkpoint: Checkpoint, summary: EtlSummary) -> None:
    """Totals over the whole job, resumed runs included."""
    states = checkpoint.sources.values()
    summary.rows_in = sum(s["rows_in"] for s in states)
    summary.total_scored = sum(s["rows_scored"] for s in states)
    summary.rejected = sum(s["rejected"] for s in states)
    summary.files = sum(s["files"] for s in states)
    summary.rejects_files = sorted({f for s in states for f in s.get("rejects_files", [])})


def summary_lines(s: EtlSummary, job: EtlJob) -> list[str]:
    unit = "records" if job.topic else "input rows"
    lines = [
        f"etl: {s.rows_in:,} {unit} read, {s.rejected:,} rejected, {s.total_scored:,} item rows scored "
        f"into {s.files:,} Parquet files in {job.output}",
        f"etl: this run {s.rows_scored:,} rows in {s.seconds:.1f} s = {s.rows_per_s:,.0f} rows/s "
        f"({s.chunks_done} chunks; {s.chunks_skipped} finished by an earlier run), "
        f"{job.batch_rows} rows per ONNX call on {s.provider}",
    ]
    if s.rejected:
        lines.append(f"etl: rejected rows and reasons: {job.output}/{REJECTS_DIR}/ ({len(s.rejects_files)} files)")
    return lines
