"""`tidebatch etl` over files (no broker): resume after an interruption gives the files
of an uninterrupted run, bad rows go to the rejects file with a reason, failures are
one line naming the problem, and scores match the worker's featurisation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from models.registry import load_spec
from pipeline.cli import main as cli_main
from pipeline.codecs.ctr import CtrCodec
from pipeline.errors import UserError
from pipeline.etl.checkpoint import Checkpoint
from pipeline.etl.features import featurize_flat
from pipeline.etl.job import JobInterrupted, run_etl
from pipeline.etl.settings import EtlJob
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.loadgen.ctr_files import flat_rows_table
from pipeline.runtime.session import InferenceSession

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CHUNK = 700


@pytest.fixture(scope="module")
def flat() -> pa.Table:
    """~3000 item rows of whole requests; request i at T0 + i seconds."""
    return flat_rows_table(seed=3, min_rows=3000, t0_ms=T0)


def with_bad_rows(table: pa.Table) -> tuple[pa.Table, dict[int, str]]:
    """A copy with a few broken rows; returns {row: reason prefix}."""
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    cols["C14"][5] = "zz-not-hex"
    cols["item_id"][100] = None
    cols["request_id"][1500] = ""
    cols["C2"][2999] = "0123456789abcdef0"  # 17 digits
    bad = {5: "C14: expected hex string", 100: "item_id:", 1500: "request_id:", 2999: "C2: expected hex string"}
    return pa.table(cols, schema=table.schema), bad


def job(out: Path, inputs: list[Path], **kw: object) -> EtlJob:
    params = {"chunk_rows": CHUNK, "batch_rows": 256, "providers": "cpu", "progress": False, **kw}
    return EtlJob(output=str(out), inputs=[str(p) for p in inputs], **params)  # type: ignore[arg-type]


def hashes(root: Path) -> dict[str, str]:
    """Every output file but the checkpoint, by content hash."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "_etl" not in p.parts
    }


def read(root: Path) -> pa.Table:
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table()


# ----------------------------------------------------------------------------- resume
@pytest.mark.parametrize("stop_after", [1, 3])
def test_interrupted_then_resumed_gives_the_same_files(tmp_path: Path, flat: pa.Table, stop_after: int) -> None:
    data, _ = with_bad_rows(flat)
    src = tmp_path / "requests.parquet"
    pq.write_table(data, src, row_group_size=500)
    run_etl(job(tmp_path / "whole", [src]))
    with pytest.raises(JobInterrupted):
        run_etl(job(tmp_path / "resumed", [src], stop_after_chunks=stop_after))
    summary = run_etl(job(tmp_path / "resumed", [src]))
    assert summary.chunks_skipped == stop_after
    assert summary.total_scored == data.num_rows - 4 and summary.rejected == 4
    assert hashes(tmp_path / "resumed") == hashes(tmp_path / "whole")
    assert len(hashes(tmp_path / "whole")) >= 5


def test_a_crash_after_writing_files_but_before_the_checkpoint(
    tmp_path: Path, flat: pa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "requests.parquet"
    pq.write_table(flat, src)
    run_etl(job(tmp_path / "whole", [src]))
    saves = {"n": 0}
    real_save = Checkpoint.save

    def save_then_die(self: Checkpoint) -> None:
        saves["n"] += 1
        if saves["n"] == 3:  # chunk 3's files are written; its checkpoint never is
            raise KeyboardInterrupt
        real_save(self)

    monkeypatch.setattr(Checkpoint, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        run_etl(job(tmp_path / "crashed", [src]))
    monkeypatch.setattr(Checkpoint, "save", real_save)
    run_etl(job(tmp_path / "crashed", [src]))
    assert hashes(tmp_path / "crashed") == hashes(tmp_path / "whole")


def test_a_different_job_in_the_same_output_is_refused(tmp_path: Path, flat: pa.Table) -> None:
    src = tmp_path / "requests.parquet"
    pq.write_table(flat, src)
    run_etl(job(tmp_path / "out", [src]))
    with pytest.raises(UserError, match="holds a different job \\(chunk differs\\)"):
        run_etl(job(tmp_path / "out", [src], chunk_rows=CHUNK + 1))


# ----------------------------------------------------------------------------- contents
def test_layout_scores_and_partitions(tmp_path: Path, flat: pa.Table) -> None:
    src = tmp_path / "requests.parquet"
    pq.write_table(flat, src)
    summary = run_etl(job(tmp_path / "out", [src], columns=["I1", "C14"], roll_interval_s=60.0))
    table = read(tmp_path / "out")
    assert table.num_rows == flat.num_rows == summary.total_scored
    names = sorted(p.name for p in (tmp_path / "out").rglob("*.parquet"))
    assert names[0] == "requests.parquet+0+0000000000.parquet"
    assert set(table.column("model").to_pylist()) == {"ctr_deepfm"}
    # request i is at T0 + i s: 1-minute buckets split files inside chunks
    assert len(names) > -(-flat.num_rows // CHUNK)
    keys = list(zip(table.column("request_id").to_pylist(), table.column("item_id").to_pylist(), strict=True))
    assert len(set(keys)) == len(keys)
    assert table.column("scored_at").null_count == table.num_rows  # nothing timing-dependent
    assert set(table.column("batch_rows").to_pylist()) <= set(range(1, 257))


def test_scores_match_the_worker_codec_path(tmp_path: Path) -> None:
    """The same requests as Kafka JSON (codec) and as flat rows (vectorised): identical
    features, and the job's scores equal an unbatched run of the model."""
    factory = CtrRequestFactory(seed=11)
    codec = CtrCodec()
    decoded = [codec.decode(factory.make(i)[1]) for i in range(20)]
    table = flat_rows_table(seed=11, min_rows=sum(d.rows for d in decoded))
    feats, rejects = featurize_flat(table, 0, 0, "x")
    assert not rejects
    n = sum(d.rows for d in decoded)
    dense = np.concatenate([d.payload.dense for d in decoded])
    cat = np.concatenate([d.payload.cat for d in decoded])
    assert np.array_equal(feats.dense[:n], dense, equal_nan=True)
    assert np.array_equal(feats.cat[:n], cat)
    src = tmp_path / "r.parquet"
    pq.write_table(table, src)
    run_etl(job(tmp_path / "out", [src]))
    got = read(tmp_path / "out").sort_by("source_offset").column("score").to_numpy()[:n]
    session = InferenceSession(load_spec("ctr").onnx_path, "cpu")
    want = np.concatenate([session.run({"dense": d.payload.dense, "cat": d.payload.cat})["prob"] for d in decoded])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- bad rows
def test_bad_rows_are_counted_and_written_with_reasons(tmp_path: Path, flat: pa.Table) -> None:
    data, bad = with_bad_rows(flat)
    src = tmp_path / "requests.parquet"
    pq.write_table(data, src)
    summary = run_etl(job(tmp_path / "out", [src]))
    assert summary.rejected == len(bad)
    rejected = {}
    for f in sorted((tmp_path / "out" / "_rejects").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            rejected[r["offset"]] = r
    assert sorted(rejected) == sorted(bad)
    for offset, prefix in bad.items():
        assert rejected[offset]["reason"].startswith(prefix), rejected[offset]["reason"]
        assert "\n" not in rejected[offset]["reason"]
    assert rejected[5]["value"]["C14"] == "zz-not-hex"
    offsets = set(read(tmp_path / "out").column("source_offset").to_pylist())
    assert not offsets & set(bad) and len(offsets) == data.num_rows - len(bad)


def test_csv_with_bad_numbers_and_a_ragged_line(tmp_path: Path, flat: pa.Table) -> None:
    small = flat.slice(0, 50)
    src = tmp_path / "requests.csv"
    pcsv.write_csv(small, src)
    lines = src.read_text().splitlines()
    header = lines[0].split(",")
    row = lines[4].split(",")
    row[header.index('"I9"')] = '"lots"'
    lines[4] = ",".join(row)
    lines.insert(10, '"only","three","fields"')
    src.write_text("\n".join(lines) + "\n")
    summary = run_etl(job(tmp_path / "out", [src]))
    assert summary.rejected == 2 and summary.total_scored == 49
    reasons = [json.loads(x)["reason"] for f in (tmp_path / "out" / "_rejects").glob("*") for x in f.read_text().splitlines()]
    assert any(r.startswith("I9: expected number or null, got 'lots'") for r in reasons), reasons
    assert any("CSV line has 3 fields" in r for r in reasons), reasons


def test_jsonl_flat_rows_and_request_lines(tmp_path: Path, flat: pa.Table) -> None:
    rows = flat.slice(0, 40).to_pylist()
    rows[3]["I2"] = "seven"
    flat_src = tmp_path / "flat.jsonl"
    flat_src.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n{broken\n")
    factory = CtrRequestFactory(seed=5)
    req_src = tmp_path / "requests.jsonl"
    lines = [factory.make(i)[1] for i in range(30)] + [factory.make_invalid("mistyped_field")]
    req_src.write_bytes(b"\n".join(lines) + b"\n")
    summary = run_etl(job(tmp_path / "out", [flat_src, req_src]))
    assert summary.rejected == 3
    n_items = sum(len(orjson.loads(v)["items"]) for v in lines[:30])
    assert summary.total_scored == 39 + n_items
    table = read(tmp_path / "out")
    by_source = table.group_by("source_topic").aggregate([("request_id", "count")]).to_pydict()
    assert dict(zip(by_source["source_topic"], by_source["request_id_count"], strict=True)) == {
        "flat.jsonl": 39, "requests.jsonl": n_items,
    }
    reasons = [json.loads(x)["reason"] for f in (tmp_path / "out" / "_rejects").glob("*") for x in f.read_text().splitlines()]
    assert any(r.startswith("I2: expected number or null, got string") for r in reasons)
    assert any(r.startswith("malformed JSON") for r in reasons)
    assert any(r.startswith("items[0].C14: expected hex string or null, got int") for r in reasons)


# ----------------------------------------------------------------------------- failures
class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`tidebatch etl ...` through the real CLI error handling (pipeline/cli.py main), in
    this process: a subprocess per call cost seconds of imports."""
    capsys.readouterr()
    code = cli_main(["etl", *args])
    out, err = capsys.readouterr()
    return Ran(code, out, err)


def test_failures_are_one_line_naming_the_problem(tmp_path: Path, flat: pa.Table, capsys) -> None:
    out = str(tmp_path / "out")
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    missing_col = tmp_path / "nocol.parquet"
    pq.write_table(flat.drop_columns(["C14"]), missing_col)
    wrong_type = tmp_path / "wrongtype.parquet"
    pq.write_table(flat.set_column(flat.schema.get_field_index("C3"), "C3", pa.array(range(flat.num_rows))), wrong_type)
    cases = {
        str(tmp_path / "nope.parquet"): "input not found",
        str(garbage): "cannot read input",
        str(missing_col): "missing column 'C14'",
        str(wrong_type): "column 'C3' has type int64, expected hex strings",
    }
    for path, words in cases.items():
        proc = cli(capsys, path, "-o", out, "--no-progress")
        assert proc.returncode == 2, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("tidebatch: error:")]
        assert len(errors) == 1 and words in errors[0], proc.stderr
        assert "Traceback" not in proc.stderr


def test_cli_success_prints_a_summary_and_progress(tmp_path: Path, flat: pa.Table, capsys) -> None:
    src = tmp_path / "requests.parquet"
    pq.write_table(flat, src)
    proc = cli(capsys, str(src), "-o", str(tmp_path / "out"), "--chunk-rows", "1000", "--columns", "I1,C14", "--providers", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert f"{flat.num_rows:,} input rows read, 0 rejected" in proc.stdout
    assert "rows/s" in proc.stderr and "ETA" in proc.stderr
    assert read(tmp_path / "out").column_names[-5:] == ["I1", "C14", "model", "date", "hour"]
