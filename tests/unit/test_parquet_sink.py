"""ParquetSink with fake scored rows in temporary directories: rolling, naming, atomic
writes, ack order, offset ordering and replay after a crash."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from consumers.records import SourceRecord
from pipeline.clock import FakeClock
from pipeline.codecs.base import Decoded
from pipeline.codecs.ctr import CtrPayload
from pipeline.config import load_config
from pipeline.errors import UserError
from pipeline.sinks import ScoredRow, notify
from pipeline.sinks.config import ParquetSinkConfig
from pipeline.sinks.parquet import ParquetSink, SinkError, merge_ranges
from pipeline.sinks.storage import LocalStorage

T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
TOPIC = "ctr.requests"
# Columns that depend on when and how a row was scored, not on the record.
TIMING_COLUMNS = ["scored_at", "batch_rows", "late"]


class Acks:
    """Collects acks per (partition, offset); optionally checks the file exists then."""

    def __init__(self) -> None:
        self.done: list[tuple[int, int]] = []
        self.check: Path | None = None

    def committed(self, partition: int = 0, start: int = 0) -> int:
        """The offset a worker would commit: first offset without an ack."""
        have = {o for p, o in self.done if p == partition}
        o = start
        while o in have:
            o += 1
        return o


def make_row(
    acks: Acks,
    offset: int,
    *,
    items: int = 3,
    partition: int = 0,
    ts: int | None = None,
    item_id_len: int = 4,
    scored_at: int = T0,
) -> ScoredRow:
    ts = T0 + offset * 1000 if ts is None else ts
    rec = SourceRecord(TOPIC, partition, offset, f"user-{offset % 7}".encode(), b"{}", {}, ts)
    dense = np.full((items, 13), float(offset), np.float32)
    cat = np.tile(np.arange(100, 126, dtype=np.int64), (items, 1))
    ids = [f"item-{offset}-{k}".ljust(item_id_len, "x") for k in range(items)]
    decoded = Decoded(f"req-{offset}", items, CtrPayload(dense, cat), extra={"item_ids": ids})
    result = {
        "request_id": f"req-{offset}",
        "item_ids": ids,
        "scores": [round(0.01 * ((offset + k) % 100), 3) for k in range(items)],
        "model": "ctr_deepfm",
        "model_version": "1.0.0",
        "batch_rows": 64,
        "scored_at_ms": scored_at,
        "priority": 0,
        "late": False,
    }

    def ack() -> None:
        if acks.check is not None:
            # the sink acks only once the row's file is in place
            assert any(acks.check.rglob(f"{TOPIC}+{partition}+*.parquet"))
        acks.done.append((partition, offset))

    return ScoredRow(rec, decoded, result, ack)


def sink_for(path: Path, clock: FakeClock | None = None, **kw: object) -> ParquetSink:
    cfg = ParquetSinkConfig(enabled=True, path=str(path), **{"max_open_s": 0.0, **kw})  # type: ignore[arg-type]
    return ParquetSink(cfg, "ctr", "ctr_deepfm", background=False, clock=(clock or FakeClock()).now)


def feed(sink: ParquetSink, rows: Iterable[ScoredRow]) -> None:
    rows = list(rows)
    sink.track([r.rec for r in rows])
    sink.write(rows)


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def read_all(root: Path) -> pa.Table:
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table()


def contents(root: Path) -> dict[str, pa.Table]:
    """File name -> its table without the timing columns."""
    return {
        name: pq.read_table(root / name).drop_columns(TIMING_COLUMNS).replace_schema_metadata(None)
        for name in files(root)
    }


# ----------------------------------------------------------------------------- rolling
def test_rolls_by_rows_at_request_boundaries(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path, roll_rows=10)
    feed(sink, [make_row(acks, o) for o in range(7)])  # 3 items each
    sink.flush()
    names = [Path(f).name for f in files(tmp_path)]
    # 3 requests (9 rows) fit; a 4th would make 12 > 10 rows
    assert names == [f"{TOPIC}+0+0000000000.parquet", f"{TOPIC}+0+0000000003.parquet", f"{TOPIC}+0+0000000006.parquet"]
    sizes = [pq.read_metadata(tmp_path / f).num_rows for f in files(tmp_path)]
    assert sizes == [9, 9, 3]
    assert sorted(o for _, o in acks.done) == list(range(7))


def test_rolls_by_estimated_bytes(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path, roll_bytes=2048)
    feed(sink, [make_row(acks, o, item_id_len=200) for o in range(6)])  # ~ 3 x 290 bytes each
    sink.flush()
    assert len(files(tmp_path)) == 3
    assert read_all(tmp_path).num_rows == 18


def test_rolls_by_record_time_and_partitions_by_hour(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path, roll_interval_s=60)
    hour = 3_600_000
    base = (T0 // hour + 1) * hour  # a full hour
    stamps = [base - 61_000, base - 30_000, base - 1, base, base + 59_999, base + 60_000]
    feed(sink, [make_row(acks, o, ts=ts) for o, ts in enumerate(stamps)])
    sink.flush()
    assert files(tmp_path) == [
        f"model=ctr_deepfm/date=2023-11-14/hour=22/{TOPIC}+0+0000000000.parquet",
        f"model=ctr_deepfm/date=2023-11-14/hour=22/{TOPIC}+0+0000000001.parquet",
        f"model=ctr_deepfm/date=2023-11-14/hour=23/{TOPIC}+0+0000000003.parquet",
        f"model=ctr_deepfm/date=2023-11-14/hour=23/{TOPIC}+0+0000000005.parquet",
    ]


def test_max_open_s_finishes_idle_files_and_replay_keeps_the_boundary(tmp_path: Path) -> None:
    clock = FakeClock()
    acks = Acks()
    sink = sink_for(tmp_path, clock, max_open_s=5.0)
    feed(sink, [make_row(acks, o) for o in range(3)])
    sink.poll()
    assert files(tmp_path) == [] and acks.done == []
    clock.advance(5.0)
    sink.poll()
    assert [Path(f).name for f in files(tmp_path)] == [f"{TOPIC}+0+0000000000.parquet"]
    assert len(acks.done) == 3
    # later rows start a new file; a replay of everything changes nothing already written
    feed(sink, [make_row(acks, o) for o in range(3, 5)])
    # crash before the second file: restart from the committed offset 3, then from 0
    for start in (3, 0):
        again = Acks()
        replay = sink_for(tmp_path, FakeClock())
        feed(replay, [make_row(again, o) for o in range(start, 5)])
        replay.flush()
        assert sorted(o for _, o in again.done) == list(range(start, 5))
    assert [Path(f).name for f in files(tmp_path)] == [f"{TOPIC}+0+0000000000.parquet", f"{TOPIC}+0+0000000003.parquet"]
    assert read_all(tmp_path).num_rows == 15


# ----------------------------------------------------------------------------- naming, atomicity, acks
def test_file_names_dirs_schema_and_metadata(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path, columns=["I1", "C14"])
    feed(sink, [make_row(acks, o, partition=2) for o in range(1234, 1236)])
    sink.flush()
    (name,) = files(tmp_path)
    assert name == f"model=ctr_deepfm/date=2023-11-14/hour=22/{TOPIC}+2+0000001234.parquet"
    table = pq.read_table(tmp_path / name)
    assert table.column_names == [
        "request_id", "item_id", "item_pos", "score", "key", "model_version", "tenant",
        "priority", "late", "batch_rows", "record_ts", "scored_at", "source_topic",
        "source_partition", "source_offset", "I1", "C14",
    ]
    assert table.column("item_pos").to_pylist() == [0, 1, 2, 0, 1, 2]
    assert table.column("source_offset").to_pylist() == [1234] * 3 + [1235] * 3
    assert table.column("I1").to_pylist() == [1234.0] * 3 + [1235.0] * 3
    assert table.column("C14").to_pylist() == [113] * 6
    meta = table.schema.metadata
    assert meta[b"tidebatch.first_offset"] == b"1234" and meta[b"tidebatch.last_offset"] == b"1235"
    assert pa.types.is_timestamp(table.schema.field("record_ts").type)


def test_acks_come_only_after_the_file_is_in_place(tmp_path: Path) -> None:
    acks = Acks()
    acks.check = tmp_path
    sink = sink_for(tmp_path, roll_rows=6)
    feed(sink, [make_row(acks, o) for o in range(5)])
    assert len(acks.done) == 4  # two full files (2 requests each); the 5th is in the open file
    sink.flush()
    assert len(acks.done) == 5


def test_a_crash_during_the_write_leaves_no_visible_file_and_no_ack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acks = Acks()
    sink = sink_for(tmp_path)
    feed(sink, [make_row(acks, o) for o in range(3)])

    def crash(src: str, dst: str) -> None:
        if dst.endswith(".parquet"):
            raise OSError("simulated crash before rename")
        os.rename(src, dst)

    monkeypatch.setattr(os, "replace", crash)
    sink.flush()
    assert files(tmp_path) == []  # only the hidden temporary exists
    hidden = [p.name for p in tmp_path.rglob(".*.tmp")]
    assert hidden == [f".{TOPIC}+0+0000000000.parquet.tmp"]
    assert read_all(tmp_path).num_rows == 0  # readers skip dot files
    assert acks.done == []
    with pytest.raises(SinkError, match="simulated crash"):
        sink.poll()


def test_background_writer_thread(tmp_path: Path) -> None:
    acks = Acks()
    cfg = ParquetSinkConfig(enabled=True, path=str(tmp_path), roll_rows=10)
    sink = ParquetSink(cfg, "ctr", "ctr_deepfm")
    rows = [make_row(acks, o) for o in range(20)]
    sink.track([r.rec for r in rows])
    for r in reversed(rows):
        sink.write([r])
    sink.flush()
    sink.poll()
    sink.close()
    assert sorted(o for _, o in acks.done) == list(range(20))
    assert read_all(tmp_path).column("source_offset").to_pylist() == sorted(o for o in range(20) for _ in range(3))


# ----------------------------------------------------------------------------- ordering
def test_out_of_order_rows_are_written_in_offset_order_contiguous_only(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path)
    rows = [make_row(acks, o) for o in range(10)]
    sink.track([r.rec for r in rows])
    late = rows[1:]
    random.Random(4).shuffle(late)
    sink.write(late)
    sink.flush()
    assert files(tmp_path) == [] and acks.done == []  # offset 0 is still in flight
    sink.write(rows[:1])
    sink.flush()
    offsets = read_all(tmp_path).column("source_offset").to_pylist()
    assert offsets == sorted(offsets) and len(set(offsets)) == 10


def test_skipped_offsets_do_not_block_and_have_no_rows(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path)
    rows = [make_row(acks, o) for o in range(6)]
    sink.track([r.rec for r in rows])
    sink.write([rows[5], rows[3], rows[0]])
    notify([sink], "skip", [rows[4].rec, rows[1].rec, rows[2].rec])  # dead letter, late, dropped
    sink.flush()
    assert sorted(set(read_all(tmp_path).column("source_offset").to_pylist())) == [0, 3, 5]


def test_revoke_finishes_when_drained_then_ignores_the_partition(tmp_path: Path) -> None:
    acks = Acks()
    sink = sink_for(tmp_path)
    rows = [make_row(acks, o) for o in range(4)]
    sink.track([r.rec for r in rows])
    sink.write(rows[:2])
    sink.revoke([(TOPIC, 0)])
    assert files(tmp_path) == []  # offsets 2 and 3 are still in flight
    sink.write(rows[2:])
    assert len(files(tmp_path)) == 1 and len(acks.done) == 4  # drained: file finished, no flush
    sink.write([make_row(acks, 4)])  # a straggler after the revoke: not ours any more
    sink.flush()
    assert read_all(tmp_path).num_rows == 12 and len(acks.done) == 4


# ----------------------------------------------------------------------------- replay
def uninterrupted(root: Path, n: int, **kw: object) -> None:
    acks = Acks()
    sink = sink_for(root, **kw)
    feed(sink, [make_row(acks, o) for o in range(n)])
    sink.flush()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replay_after_a_crash_rewrites_the_same_files(tmp_path: Path, seed: int) -> None:
    n, kw = 40, {"roll_rows": 12, "roll_interval_s": 20.0}
    uninterrupted(tmp_path / "reference", n, **kw)
    root = tmp_path / "crashed"
    rng = random.Random(seed)
    acks = Acks()
    first = sink_for(root, **kw)
    rows = [make_row(acks, o, scored_at=T0 + 1) for o in range(n)]
    first.track([r.rec for r in rows])
    done = rows[: rng.randrange(5, n - 5)]
    rng.shuffle(done)
    first.write(done)  # then SIGKILL: the open file is lost, no flush
    committed = acks.committed()
    # a worker commits at intervals: restart anywhere at or before the watermark
    restart = rng.randrange(0, committed + 1)
    again = Acks()
    second = sink_for(root, **kw)
    feed(second, [make_row(again, o, scored_at=T0 + 2) for o in range(restart, n)])
    second.flush()
    assert sorted(o for _, o in again.done) == list(range(restart, n))
    assert files(root) == files(tmp_path / "reference")
    ref = contents(tmp_path / "reference")
    for name, table in contents(root).items():
        assert table.equals(ref[name]), name
    keys = read_all(root).select(["request_id", "item_id"]).to_pylist()
    assert len(keys) == len({(k["request_id"], k["item_id"]) for k in keys}) == 3 * n


def test_a_file_written_but_not_recorded_is_adopted_not_duplicated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash after the file was renamed into place but before its rows were acked: the
    replay (from before the file) must not write a second file with the same rows."""
    acks = Acks()
    sink = sink_for(tmp_path, roll_rows=9)
    real_put = LocalStorage.put

    def put_then_die(self: LocalStorage, rel: str, data: bytes) -> None:
        real_put(self, rel, data)
        if rel.endswith("0000000003.parquet"):
            raise KeyboardInterrupt  # the process dies right after the rename

    monkeypatch.setattr(LocalStorage, "put", put_then_die)
    rows = [make_row(acks, o) for o in range(8)]
    sink.track([r.rec for r in rows])
    with pytest.raises(KeyboardInterrupt):
        sink.write(rows)
    monkeypatch.setattr(LocalStorage, "put", real_put)
    assert acks.committed() == 3  # the second file's rows were never acked
    # the replay decides differently about offset 3 (e.g. routed late this time)
    again = Acks()
    replay = sink_for(tmp_path, roll_rows=9)
    rows = [make_row(again, o) for o in range(3, 8)]
    replay.track([r.rec for r in rows])
    replay.skip([rows[0].rec])
    replay.write(rows[1:])
    replay.flush()
    offsets = read_all(tmp_path).column("source_offset").to_pylist()
    assert sorted(set(offsets)) == list(range(8)) and len(offsets) == 24
    state = json.loads((tmp_path / "_state/model=ctr_deepfm" / f"{TOPIC}+0.json").read_text())
    assert state["pending"]["path"].endswith("0000000006.parquet")  # the last file, adopted on load
    assert sink_for(tmp_path)._load((TOPIC, 0)).covered == [[0, 7]]


def test_rows_of_covered_offsets_are_acked_without_rewriting(tmp_path: Path) -> None:
    uninterrupted(tmp_path, 6, roll_rows=9)
    before = {f: (tmp_path / f).stat().st_mtime_ns for f in files(tmp_path)}
    acks = Acks()
    sink = sink_for(tmp_path, roll_rows=9)
    feed(sink, [make_row(acks, o) for o in range(6)])
    assert sorted(o for _, o in acks.done) == list(range(6))
    sink.flush()
    assert {f: (tmp_path / f).stat().st_mtime_ns for f in files(tmp_path)} == before


def test_requests_mode_for_results_without_items(tmp_path: Path) -> None:
    """Camera-like results: one row per request, the codec's fields as JSON."""
    acks = Acks()
    cfg = ParquetSinkConfig(enabled=True, path=str(tmp_path), max_open_s=0.0, columns=["camera_id"])
    sink = ParquetSink(cfg, "camera", "face_detector", background=False)
    rows = []
    for o in range(3):
        rec = SourceRecord("camera.frames", 0, o, b"cam-1", b"", {}, T0 + o)
        dets = [{"box": [1.0, 2.0, 3.0, 4.0], "score": 0.9}] * o
        decoded = Decoded(f"cam-1/{o}", 1, None, extra={"camera_id": "cam-1"})
        result = {"camera_id": "cam-1", "frame_id": o, "detections": dets, "model": "face_detector",
                  "model_version": "1", "batch_rows": 3, "scored_at_ms": T0, "priority": 0, "late": False}
        rows.append(ScoredRow(rec, decoded, result, lambda o=o: acks.done.append((0, o))))
    feed(sink, rows)
    sink.flush()
    table = read_all(tmp_path)
    assert table.num_rows == 3 and "item_id" not in table.column_names
    assert table.column("request_id").to_pylist() == ["cam-1/0", "cam-1/1", "cam-1/2"]
    result = json.loads(table.column("result")[2].as_py())
    assert result["frame_id"] == 2 and len(result["detections"]) == 2 and "model" not in result
    assert table.column("camera_id").to_pylist() == ['"cam-1"'] * 3
    assert pq.read_schema(next(tmp_path.rglob("*.parquet"))).metadata[b"tidebatch.mode"] == b"requests"


def test_merge_ranges() -> None:
    assert merge_ranges([[0, 9]], [10, 19]) == [[0, 19]]
    assert merge_ranges([[0, 9]], [5, 7]) == [[0, 9]]
    assert merge_ranges([[20, 29]], [0, 9]) == [[0, 9], [20, 29]]


# ----------------------------------------------------------------------------- other storage, config
def test_fsspec_memory_url() -> None:
    pytest.importorskip("fsspec")
    import fsspec

    acks = Acks()
    cfg = ParquetSinkConfig(enabled=True, path="memory://tidebatch-test/scores", max_open_s=0.0)
    sink = ParquetSink(cfg, "ctr", "ctr_deepfm", background=False)
    feed(sink, [make_row(acks, o) for o in range(3)])
    sink.flush()
    fs = fsspec.filesystem("memory")
    (path,) = fs.glob("/tidebatch-test/scores/**/*.parquet")
    assert path.endswith(f"{TOPIC}+0+0000000000.parquet")
    with fs.open(path, "rb") as f:
        assert pq.read_table(f).num_rows == 9
    assert len(acks.done) == 3


def test_sinks_config_from_env_and_validation() -> None:
    env = {
        "TIDEBATCH_SINKS__PARQUET__ENABLED": "true",
        "TIDEBATCH_SINKS__PARQUET__ROLL_ROWS": "5000",
        "TIDEBATCH_SINKS__PARQUET__COLUMNS": "[I1, C14]",
    }
    cfg = load_config(environ=env)
    assert cfg.sinks.parquet.enabled and cfg.sinks.parquet.roll_rows == 5000
    assert cfg.sinks.parquet.columns == ["I1", "C14"]
    with pytest.raises(UserError, match="'sinks.parquet.roll_interval_s'"):
        load_config(environ={"TIDEBATCH_SINKS__PARQUET__ROLL_INTERVAL_S": "0"})
    with pytest.raises(UserError, match="'sinks.parquet.compression'"):
        load_config(environ={"TIDEBATCH_SINKS__PARQUET__COMPRESSION": "brotli9"})
    with pytest.raises(UserError, match="'sinks.parquet.columns': 'I99' is not a CTR feature"):
        sink_for(Path("/tmp"), columns=["I99"])
    with pytest.raises(UserError, match="'sinks.parquet.path': cannot create /proc/tidebatch"):
        sink_for(Path("/proc/tidebatch"))
