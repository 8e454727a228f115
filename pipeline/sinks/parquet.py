"""Parquet sink: every scored row lands in Parquet files, one open file per Kafka
topic-partition, modelled on the Kafka Connect S3 sink (offset-named files, rolls by
size and record time) with quixstreams-style commit order (files durable, then acks,
then the worker commits). Layout and columns: pipeline/sinks/layout.py, docs/ETL.md.

Ordering. Batches overtake each other, so rows of one partition arrive out of offset
order. The sink learns every consumed offset (`track`), and which of them end without a
row (`skip`: dead letter, routed late, dropped replay); it appends a row to the open
file only when every earlier tracked offset is resolved. Files therefore hold
contiguous offset ranges, in order, and never overlap.

Replay. A file is finished in this order: encode -> record it as `pending` in the
partition's state file -> write it atomically (storage.py) -> add its offset range to
the state's `covered` ranges -> ack its rows. After a crash the worker restarts from
its last committed offset, which is never past an unacked row:

- rows inside a covered range are already durable: acked, not written again;
- a `pending` file that exists was written but maybe not acked: it is adopted (its
  range counts as covered), so a replay never writes an overlapping file beside it;
- the open file at crash time was never renamed into place; the replay rebuilds it
  from the same first offset, so it gets the same name.

Roll points come from the records only (row count, estimated bytes, record-time
bucket), so a replay cuts files where an uninterrupted run would. The one wall-clock
trigger (`max_open_s`, for idle partitions) is safe too: its boundary is persisted
before the rows are acked, and a replay honours persisted boundaries.

Threads: write() runs in executor threads, track()/skip()/poll() in the source thread.
All of them only enqueue; one writer thread owns the state, encodes and writes files,
so neither inference nor polling waits on disk. A storage failure stops the sink:
nothing more is acked, and poll() raises so the worker exits without committing
past durable rows.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from consumers.records import SourceRecord, TopicPartition
from pipeline.errors import UserError
from pipeline.sinks import ScoredRow
from pipeline.sinks import layout as L
from pipeline.sinks.config import ParquetSinkConfig
from pipeline.sinks.storage import Storage, open_storage

log = logging.getLogger(__name__)

MAX_COVERED_RANGES = 64  # per partition; only operator offset resets add ranges
_TICK_S = 0.2  # the writer thread checks max_open_s at least this often
_QUEUE_COMMANDS = 10_000  # bounded: a writer that falls behind slows the executors down
_FLUSH_TIMEOUT_S = 120.0


class SinkError(RuntimeError):
    """The sink cannot make rows durable; the worker must stop."""


@dataclass
class _OpenFile:
    first: int
    last: int
    bucket: tuple[int, int]
    directory: str
    buf: L.FileBuffer
    opened: float
    acks: list[ScoredRow] = field(default_factory=list)
    offsets: set[int] = field(default_factory=set)


@dataclass
class _Partition:
    tp: TopicPartition
    covered: list[list[int]]  # durable [first, last] offset ranges, sorted, merged
    cover_start: int | None = None  # where the next finished file's range starts
    order: deque[int] = field(default_factory=deque)  # tracked, unresolved, ascending
    ready: dict[int, list[ScoredRow]] = field(default_factory=dict)  # [] = skipped
    last_tracked: int = -1
    open: _OpenFile | None = None
    closing: bool = False

    def is_covered(self, offset: int) -> bool:
        for a, b in reversed(self.covered):  # usually one range, and offset past it
            if offset > b:
                return False
            if offset >= a:
                return True
        return False


def merge_ranges(ranges: list[list[int]], new: list[int]) -> list[list[int]]:
    """Add [a, b] to sorted inclusive ranges, merging overlapping and adjacent ones;
    keep the newest MAX_COVERED_RANGES."""
    out: list[list[int]] = []
    for a, b in sorted([*ranges, new]):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out[-MAX_COVERED_RANGES:]


class ParquetSink:
    name = "parquet"

    def __init__(
        self,
        cfg: ParquetSinkConfig,
        pipeline: str,
        model: str,
        *,
        storage: Storage | None = None,
        background: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.model = model
        self.storage = storage or open_storage(cfg.path)
        check = getattr(self.storage, "check_writable", None)
        if check is not None:
            try:
                check()
            except UserError as exc:
                raise UserError(f"config key 'sinks.parquet.path': {exc}") from None
        self.inputs = L.input_fields(pipeline, cfg.columns)
        self.clock = clock
        self.stats = {"files": 0, "rows": 0, "bytes": 0}
        self._interval_ms = max(int(cfg.roll_interval_s * 1000), 1)
        self._parts: dict[TopicPartition, _Partition] = {}
        self._lock = threading.Lock()  # the state; held by whoever applies a command
        self._error: str | None = None
        self._queue: queue.Queue[tuple[str, Any]] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(_QUEUE_COMMANDS)
            self._thread = threading.Thread(target=self._run, name="parquet-sink", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ public API
    def track(self, records: Sequence[SourceRecord]) -> None:
        self._submit("track", list(records))

    def skip(self, records: Sequence[SourceRecord]) -> None:
        self._submit("skip", list(records))

    def write(self, rows: list[ScoredRow]) -> None:
        if rows:
            self._submit("write", list(rows))

    def revoke(self, tps: Sequence[TopicPartition]) -> None:
        self._submit("revoke", list(tps))

    def poll(self) -> None:
        """Source thread: surface a storage failure (stops the worker)."""
        if self._queue is None:
            self._apply("tick", None)  # no writer thread: check max_open_s here
        if self._error:
            raise SinkError(self._error)

    def flush(self) -> None:
        """Finish every open file (contiguous rows only); returns when they are durable."""
        if self._queue is None:
            self._apply("flush", None)
            return
        done = threading.Event()
        self._queue.put(("flush", done))
        if not done.wait(_FLUSH_TIMEOUT_S):
            log.error("parquet sink: flush did not finish within %.0f s", _FLUSH_TIMEOUT_S)

    def close(self) -> None:
        if self._queue is not None and self._thread is not None:
            self._queue.put(("stop", None))
            self._thread.join(timeout=_FLUSH_TIMEOUT_S)

    @property
    def error(self) -> str | None:
        return self._error

    # ------------------------------------------------------------------ dispatch
    def _submit(self, command: str, arg: Any) -> None:
        if self._queue is None:
            self._apply(command, arg)
        else:
            self._queue.put((command, arg))

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            try:
                command, arg = self._queue.get(timeout=_TICK_S)
            except queue.Empty:
                command, arg = "tick", None
            if command == "stop":
                return
            self._apply(command, arg)

    def _apply(self, command: str, arg: Any) -> None:
        with self._lock:
            try:
                if self._error is None:
                    getattr(self, "_on_" + command)(arg)
                    self._roll_idle()
            except Exception as exc:  # storage or encoding failure: stop acking
                self._error = f"parquet sink failed: {type(exc).__name__}: {exc}".splitlines()[0]
                log.exception("parquet sink failed; no more rows are acked")
            finally:
                if command == "flush" and arg is not None:
                    arg.set()

    # ------------------------------------------------------------------ commands
    def _on_tick(self, _arg: None) -> None:
        pass

    def _on_track(self, records: list[SourceRecord]) -> None:
        for rec in records:
            part = self._parts.get(rec.tp) or self._load(rec.tp)
            if rec.offset <= part.last_tracked:
                continue  # redelivered while in flight: one outcome is enough
            if part.cover_start is None:
                part.cover_start = rec.offset
            part.last_tracked = rec.offset
            part.order.append(rec.offset)

    def _on_skip(self, records: list[SourceRecord]) -> None:
        touched = set()
        for rec in records:
            part = self._parts.get(rec.tp)
            if part is None or rec.offset in part.ready or not part.order:
                continue
            if part.order[0] <= rec.offset <= part.last_tracked:
                part.ready[rec.offset] = []
                touched.add(rec.tp)
        self._advance_all(touched)

    def _on_write(self, rows: list[ScoredRow]) -> None:
        touched = set()
        for row in rows:
            part = self._parts.get(row.rec.tp)
            if part is None:
                continue  # revoked: the partition's next owner replays it
            off = row.rec.offset
            entry = part.ready.get(off)
            if entry is not None:
                entry.append(row)  # a second outcome of one offset, or a row after a skip
            elif part.order and part.order[0] <= off <= part.last_tracked:
                part.ready[off] = [row]
            else:
                self._late_row(part, row)
            touched.add(row.rec.tp)
        self._advance_all(touched)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            part = self._parts.get(tp)
            if part is not None:
                part.closing = True
        self._advance_all(set(tps))

    def _on_flush(self, _arg: threading.Event | None) -> None:
        for tp, part in list(self._parts.items()):
            self._finish(part)
            if part.closing:
                del self._parts[tp]

    # ------------------------------------------------------------------ ordering
    def _late_row(self, part: _Partition, row: ScoredRow) -> None:
        """A row for an offset already resolved: durable already, or a second outcome
        of an offset in the open file (acked with it); anything else is not ours."""
        off = row.rec.offset
        if part.is_covered(off):
            row.ack()
        elif part.open is not None and off in part.open.offsets:
            part.open.acks.append(row)

    def _advance_all(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            part = self._parts.get(tp)
            if part is not None:
                self._advance(part)

    def _advance(self, part: _Partition) -> None:
        """Append every row whose earlier offsets are all resolved, in offset order."""
        order, ready = part.order, part.ready
        while order:
            entry = ready.get(order[0])
            if entry is None:
                break
            off = order.popleft()
            del ready[off]
            if entry:
                self._append(part, off, entry)
        if part.closing and not order:
            self._finish(part)
            del self._parts[part.tp]

    def _append(self, part: _Partition, off: int, rows: list[ScoredRow]) -> None:
        if part.is_covered(off):
            for row in rows:
                row.ack()  # written before a crash: durable already
            return
        row = rows[0]
        mode = L.row_mode(row.result)
        n, size = L.FileBuffer.measure(row, mode, len(self.inputs))
        ts = row.rec.timestamp_ms or 0
        bucket = L.bucket_of(ts, self._interval_ms)
        f = part.open
        if f is not None and (
            f.bucket != bucket
            or f.buf.mode != mode
            or f.buf.rows + n > self.cfg.roll_rows
            or f.buf.est_bytes + size > self.cfg.roll_bytes
        ):
            self._finish(part)
            f = None
        if f is None:
            buf = L.FileBuffer(mode, self.pipeline, self.inputs)
            directory = L.partition_dir(self.model, ts)
            f = part.open = _OpenFile(off, off, bucket, directory, buf, self.clock())
        f.buf.add(row, n, size)
        f.last = off
        f.acks.extend(rows)
        f.offsets.add(off)
        if f.buf.rows >= self.cfg.roll_rows or f.buf.est_bytes >= self.cfg.roll_bytes:
            self._finish(part)

    def _roll_idle(self) -> None:
        if not self.cfg.max_open_s:
            return
        now = self.clock()
        for part in self._parts.values():
            if part.open is not None and now - part.open.opened >= self.cfg.max_open_s:
                self._finish(part)

    # ------------------------------------------------------------------ files
    def _finish(self, part: _Partition) -> None:
        """Write the open file durably, record its range, then ack its rows."""
        f = part.open
        if f is None:
            return
        topic, partition = part.tp
        start = f.first if part.cover_start is None else min(part.cover_start, f.first)
        meta = {
            "tidebatch.model": self.model,
            "tidebatch.topic": topic,
            "tidebatch.partition": str(partition),
            "tidebatch.first_offset": str(f.first),
            "tidebatch.last_offset": str(f.last),
        }
        data = L.encode(f.buf.table(meta), self.cfg.compression)
        rel = f"{f.directory}/{L.file_name(topic, partition, f.first)}"
        pending = {"path": rel, "first": start, "last": f.last}
        self._save_state(part, pending)
        self.storage.put(rel, data)
        part.covered = merge_ranges(part.covered, [start, f.last])
        part.cover_start = f.last + 1
        part.open = None
        self.stats["files"] += 1
        self.stats["rows"] += f.buf.rows
        self.stats["bytes"] += len(data)
        log.debug("parquet sink: wrote %s (%d rows, offsets %d..%d)", rel, f.buf.rows, f.first, f.last)
        for row in f.acks:
            row.ack()

    def _state_rel(self, tp: TopicPartition) -> str:
        return L.state_path(self.model, tp[0], tp[1])

    def _save_state(self, part: _Partition, pending: dict[str, Any] | None) -> None:
        doc = {"version": 1, "covered": part.covered, "pending": pending}
        self.storage.put(self._state_rel(part.tp), json.dumps(doc).encode())

    def _load(self, tp: TopicPartition) -> _Partition:
        """State of a partition this process starts writing: covered ranges, with a
        pending file adopted when it made it to storage."""
        rel = self._state_rel(tp)
        raw = self.storage.get(rel)
        covered: list[list[int]] = []
        if raw is not None:
            try:
                doc = json.loads(raw)
                covered = [[int(a), int(b)] for a, b in doc.get("covered", [])]
                pending = doc.get("pending")
            except (ValueError, TypeError) as exc:
                raise SinkError(f"state file {rel} is unreadable ({exc}); move it away to start over") from None
            if pending and self.storage.exists(pending["path"]):
                covered = merge_ranges(covered, [int(pending["first"]), int(pending["last"])])
        part = self._parts[tp] = _Partition(tp, covered)
        return part
