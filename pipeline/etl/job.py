"""`tidebatch etl`: a bounded job that scores a pipeline's requests from files or from a
Kafka topic range in large batches and writes the worker sink's Parquet layout
(pipeline/sinks/layout.py, docs/ETL.md): CTR rows from flat tables or requests, any
other pipeline's requests through its own codec (pipeline/etl/pipelines.py).

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

This module runs the job (progress, the chunk loop, the summary). The job's settings
are in settings.py, its pipeline and the parts it takes (scorer, readers, writer) in
pipelines.py, its inputs in sources.py (files.py, topic.py, requests.py), its
checkpoint in checkpoint.py and its output files in writer.py, all in pipeline/etl/.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from models.registry import ModelSpec
from pipeline.errors import UserError
from pipeline.etl.checkpoint import Checkpoint
from pipeline.etl.inputs import Chunk
from pipeline.etl.pipelines import CTR, etl_parts, etl_pipeline
from pipeline.etl.settings import EtlJob, batch_rows_for, validate_job
from pipeline.etl.sources import Source, file_sources, topic_sources
from pipeline.etl.writer import REJECTS_DIR, ChunkWriter
from pipeline.sinks import layout as L
from pipeline.sinks.storage import open_storage

_PROGRESS_TTY_S = 0.25
_PROGRESS_LOG_S = 5.0


class JobInterrupted(BaseException):
    """The stop_after_chunks test hook: a crash at a chunk boundary. BaseException so
    that nothing on the way mistakes it for a failure to report."""


@dataclass
class EtlSummary:
    rows_in: int = 0  # input rows (file rows, JSONL lines, Kafka records), whole job
    rows_scored: int = 0  # scored output rows (ctr: items; other pipelines: requests), this run
    total_scored: int = 0  # scored output rows, whole job
    rejected: int = 0
    files: int = 0
    chunks_done: int = 0
    chunks_skipped: int = 0
    seconds: float = 0.0
    provider: str = ""
    batch_rows: int = 0  # rows per ONNX Runtime call (at most, for a pipeline other than ctr)
    rejects_files: list[str] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.rows_scored / self.seconds if self.seconds > 0 else 0.0


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
    from pipeline.runtime.session import InferenceSession

    validate_job(job)
    pipeline = etl_pipeline(job)
    spec = pipeline.load_model()
    job = replace(job, batch_rows=batch_rows_for(job, pipeline.max_batch_rows))
    storage = open_storage(job.output)
    L.input_fields(job.pipeline, job.columns)  # unknown column names fail before any work
    parts = etl_parts(job, pipeline, spec)
    saved = Checkpoint.saved_identity(storage)
    if job.topic:
        saved_ranges = saved.get("sources") if saved and saved.get("mode") == "topic" else None
        sources, ident = topic_sources(job, saved_ranges, parts.codec, parts.assemble)
    else:
        sources, ident = file_sources(job, parts.check_file, parts.read_file)
    identity = _identity(job, spec, ident, parts.identity)
    checkpoint = Checkpoint(storage, identity)
    checkpoint.load()
    session = InferenceSession(spec.onnx_path, job.providers, job.threads)
    writer = parts.writer(storage, job, spec)
    summary = EtlSummary(provider=session.provider, batch_rows=job.batch_rows or 0)
    progress = Progress(job.progress, progress_out)
    t0 = time.monotonic()
    try:
        _Runner(checkpoint, parts.scorer(session), writer, summary, progress, job.stop_after_chunks).run(sources)
    except OSError as exc:
        raise UserError(f"cannot write output {job.output}: {exc.strerror or exc}") from None
    summary.seconds = time.monotonic() - t0
    _totals(checkpoint, summary)
    progress.update(summary.rows_scored, 1.0, final=True)
    return summary


def _identity(job: EtlJob, spec: ModelSpec, sources: list[dict[str, Any]], pipeline: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same job: inputs, model (and for a pipeline other than
    ctr, its codec's settings) and every setting that changes file contents or chunk
    boundaries."""
    ident = {
        **pipeline,
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
        scorer: Any,
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

    def run(self, sources: list[Source]) -> None:
        self.total_weight = sum(s.weight for s in sources) or 1.0
        before = sum(s.weight * self.checkpoint.get(s.id).get("fraction", 0.0) for s in sources)
        self.progress.f0 = before / self.total_weight
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="etl-score") as pool:
            for src in sources:
                self._run_source(src, pool)
                self.done_weight += src.weight

    def _run_source(self, src: Source, pool: ThreadPoolExecutor) -> None:
        state = self.checkpoint.get(src.id)
        self.summary.chunks_skipped += state["chunks"]
        if state["done"]:
            return
        resume = state["next"] if state["next"] is not None else src.start
        inflight: deque[tuple[Chunk, Future[Any]]] = deque()
        for chunk in src.chunks(resume):
            inflight.append((chunk, pool.submit(self.scorer.score, chunk)))
            if len(inflight) > 1:
                self._finish(src, state, *inflight.popleft())
        while inflight:
            self._finish(src, state, *inflight.popleft())
        state["done"] = True
        state["fraction"] = 1.0
        self.checkpoint.save()

    def _finish(self, src: Source, state: dict[str, Any], chunk: Chunk, fut: Future[Any]) -> None:
        """Write a scored chunk, then record it: the checkpoint never runs ahead of files."""
        scored = fut.result()
        files, rejects = self.writer.write(src, chunk, scored)
        _record(state, chunk, scored, files, rejects, self.summary)
        state["fraction"] = chunk.fraction or 0.0  # for progress after a resume
        self.checkpoint.save()
        frac = (self.done_weight + src.weight * (chunk.fraction or 0.0)) / self.total_weight
        self.progress.update(self.summary.rows_scored, frac)
        if self.stop_after is not None and self.summary.chunks_done >= self.stop_after:
            raise JobInterrupted(f"stopped after {self.stop_after} chunks (test hook)")


def _record(
    state: dict[str, Any], chunk: Chunk, scored: Any, files: int, rejects: str | None, summary: EtlSummary
) -> None:
    state["next"] = chunk.next
    state["chunks"] += 1
    state["rows_in"] += chunk.rows_in
    state["rows_scored"] += scored.rows
    state["rejected"] += len(chunk.rejects) + len(scored.rejects)  # the codec's and the model's
    state["files"] += files
    if rejects:
        state.setdefault("rejects_files", []).append(rejects)
    summary.chunks_done += 1
    summary.rows_scored += scored.rows  # this run only; totals come at the end


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
    scored = "item rows" if job.pipeline == CTR else "requests"
    lines = [
        f"etl: {s.rows_in:,} {unit} read, {s.rejected:,} rejected, {s.total_scored:,} {scored} scored "
        f"into {s.files:,} Parquet files in {job.output}",
        f"etl: this run {s.rows_scored:,} rows in {s.seconds:.1f} s = {s.rows_per_s:,.0f} rows/s "
        f"({s.chunks_done} chunks; {s.chunks_skipped} finished by an earlier run), "
        f"{'' if job.pipeline == CTR else 'up to '}{s.batch_rows} rows per ONNX call on {s.provider}",
    ]
    if s.rejected:
        lines.append(f"etl: rejected rows and reasons: {job.output}/{REJECTS_DIR}/ ({len(s.rejects_files)} files)")
    return lines
