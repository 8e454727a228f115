"""`tidebatch etl` on any pipeline (pipeline/etl/pipelines.py, requests.py): which
pipeline a job scores and what it refuses, in one line each; a user's own model from a
file of requests, its rows those the worker's Parquet sink writes, its results those of
ONNX Runtime on each request alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pyarrow.dataset as ds
import pytest
import yaml

from consumers.records import SourceRecord
from pipeline.cli import main
from pipeline.errors import UserError
from pipeline.etl.job import JobInterrupted, run_etl
from pipeline.etl.requests import batches
from pipeline.etl.settings import EtlJob
from tests.own_models import ranker, run_alone

pytest.importorskip("onnx")

ENTRY = {"name": "my-ranker", "version": "3", "inputs": {"features": "dense", "tokens": "tokens"},
         "outputs": {"score": "prob", "hidden": "hidden"}, "max_batch_rows": 16}
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ranker(tmp_path_factory.mktemp("model") / "ranker.onnx")


def entry(model: Path, **more: object) -> dict:
    return {**ENTRY, "model": str(model), **more}


def requests(n: int, seed: int = 3) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"request_id": f"r{i}", "features": np.round(rng.standard_normal(4), 5).tolist(),
             "tokens": rng.integers(0, 10, int(rng.choice([1, 3, 7]))).tolist(),
             "user_id": f"u{i % 4}", "timestamp_ms": T0 + 1000 * i} for i in range(n)]


def lines_file(path: Path, docs: list[dict], extra: dict[int, bytes] | None = None) -> Path:
    lines = [orjson.dumps(d) for d in docs]
    for at, line in sorted((extra or {}).items()):
        lines.insert(at, line)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def job(model: Path, out: Path, inputs: list[Path], **kw: object) -> EtlJob:
    params = {"pipeline": "my-ranker", "pipelines": [entry(model)], "providers": "cpu", "progress": False, **kw}
    return EtlJob(output=str(out), inputs=[str(p) for p in inputs], **params)  # type: ignore[arg-type]


def read(root: Path):  # noqa: ANN201 - a pyarrow Table
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table().sort_by("source_offset")


def rejects(root: Path) -> list[dict]:
    return [json.loads(x) for f in sorted((root / "_rejects").glob("*.jsonl")) for x in f.read_text().splitlines()]


# ----------------------------------------------------------------------------- selection
def test_an_unknown_pipeline_is_one_line_that_says_how_to_define_one(tmp_path: Path) -> None:
    with pytest.raises(UserError) as no_config:
        run_etl(EtlJob(output=str(tmp_path / "o"), inputs=["x.jsonl"], pipeline="my-ranker"))
    assert str(no_config.value) == (
        "--pipeline 'my-ranker': unknown pipeline; shipped pipelines: camera, ctr, text; a pipeline of your own "
        "is a `pipelines:` entry of a worker config (give it with -c; docs/OWN_MODEL.md)")
    with pytest.raises(UserError, match=r"^--pipeline 'ranker': unknown pipeline; .*defined under the config's "
                                        r"pipelines: my-ranker$"):
        run_etl(EtlJob(output=str(tmp_path / "o"), inputs=["x.jsonl"], pipeline="ranker",
                       pipelines=[entry(tmp_path / "m.onnx")]))


def test_camera_from_files_is_refused_naming_why_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(UserError) as exc:
        run_etl(EtlJob(output=str(tmp_path / "o"), inputs=[str(tmp_path)], pipeline="camera"))
    assert str(exc.value) == (
        "etl cannot score pipeline 'camera' from files: a request is an image whose fields are Kafka headers, "
        "which a line of a file cannot hold; score a topic range of it (--topic)")


@pytest.mark.parametrize("name", ["flat.parquet", "flat.csv"])
def test_flat_tables_are_the_ctr_layout_only(model: Path, tmp_path: Path, name: str) -> None:
    src = tmp_path / name
    src.write_bytes(b"request_id\n")
    with pytest.raises(UserError) as exc:
        run_etl(job(model, tmp_path / "o", [src]))
    assert str(exc.value).startswith(f"input {name}: pipeline 'my-ranker' reads one request per line")
    assert "--format jsonl" in str(exc.value) and "\n" not in str(exc.value)


def test_the_command_takes_the_configs_pipeline_and_its_codec_settings(model: Path, tmp_path: Path) -> None:
    from pipeline.commands.etl import build_job
    from pipeline.commands.parser import build_parser

    config = tmp_path / "w.yaml"
    config.write_text(yaml.safe_dump({"pipeline": "my-ranker", "pipelines": [entry(model)], "codec": {}}))
    args = build_parser().parse_args(["etl", "x.jsonl", "-o", "out", "-c", str(config)])
    built = build_job(args)
    assert (built.pipeline, [e["name"] for e in built.pipelines], built.batch_rows) == ("my-ranker", ["my-ranker"], None)
    other = build_job(build_parser().parse_args(["etl", "x.jsonl", "-o", "o", "-c", str(config), "--pipeline", "text"]))
    assert other.pipeline == "text" and other.codec_options == {}


def test_batches_keep_one_shape_bucket_and_the_row_cap() -> None:
    from pipeline.codecs.base import Decoded

    decoded = [Decoded(f"r{i}", rows, None, bucket=b) for i, (rows, b) in
               enumerate([(1, "a"), (1, "b"), (2, "a"), (1, "a"), (5, "b"), (1, "a")])]
    assert batches(decoded, 4) == [[0, 2, 3], [1], [4], [5]]


# ----------------------------------------------------------------------------- a user's model
def test_a_users_model_from_a_request_file_equals_onnx_runtime_alone(model: Path, tmp_path: Path) -> None:
    """With one request per ONNX Runtime call the bits are those of the model alone; in
    batches (the pipeline's max_batch_rows) they agree to float precision (a MatMul of
    one row and of several take different routines: docs/OWN_MODEL.md)."""
    docs = requests(60)
    bad = {5: b'{"request_id": "bad-shape", "features": [1, 2, 3], "tokens": [1]}', 9: b"{not json", 12: b"   "}
    src = lines_file(tmp_path / "req.jsonl", docs, bad)
    alone = run_etl(job(model, tmp_path / "alone", [src], batch_rows=1, chunk_rows=25))
    batched = run_etl(job(model, tmp_path / "batched", [src], chunk_rows=25))
    assert (alone.rows_in, alone.total_scored, alone.rejected) == (63, 60, 2)
    assert batched.total_scored == 60
    one, many = read(tmp_path / "alone"), read(tmp_path / "batched")
    assert set(one.column("batch_rows").to_pylist()) == {1} and max(many.column("batch_rows").to_pylist()) > 1
    by_id = {d["request_id"]: d for d in docs}
    for row, row_b in zip(one.to_pylist(), many.to_pylist(), strict=True):
        d = by_id[row["request_id"]]
        want = run_alone(model, {"dense": np.array([d["features"]], np.float32), "tokens": np.array([d["tokens"]])})
        got, got_b = orjson.loads(row["result"]), orjson.loads(row_b["result"])
        assert np.array(got["score"], np.float32).tobytes() == want["prob"][0].tobytes()
        assert np.array(got["hidden"], np.float32).tobytes() == want["hidden"][0].tobytes()
        np.testing.assert_allclose(got_b["hidden"], want["hidden"][0], rtol=1e-6, atol=1e-6)
        assert (row["key"], row["model_version"], row["model"]) == (d["user_id"], "3", "my-ranker")
        assert row["record_ts"].timestamp() * 1000 == d["timestamp_ms"]
    assert {r["offset"]: r["reason"] for r in rejects(tmp_path / "alone")} == {
        5: "features: dimension 1 must have size 4, got 3",
        9: "malformed JSON: unexpected character, expected a string key at line 1 column 2"}


def test_a_request_the_model_refuses_is_rejected_and_its_batch_mates_scored(model: Path, tmp_path: Path) -> None:
    docs = requests(10)
    docs[4]["tokens"] = [1, 99]  # no row 99 in the embedding: ONNX Runtime refuses the batch
    summary = run_etl(job(model, tmp_path / "out", [lines_file(tmp_path / "r.jsonl", docs)]))
    assert (summary.total_scored, summary.rejected) == (9, 1)
    (refused,) = rejects(tmp_path / "out")
    assert refused["offset"] == 4 and refused["reason"].startswith("model rejected the request: ")
    assert refused["value"]["request_id"] == "r4" and "\n" not in refused["reason"]


def test_the_rows_are_the_workers_parquet_sink_rows(model: Path, tmp_path: Path) -> None:
    """The same requests through the sink (pipeline/sinks/parquet.py) as the worker
    hands them over (pipeline/scoring.py result documents): the same files, and in them
    the same rows but for what describes one worker run (late, scored_at)."""
    from models.registry import ModelSpec
    from pipeline.registry.pipelines import get_pipeline
    from pipeline.scoring import BatchTiming, ScoringStep, result_document
    from pipeline.sinks import ScoredRow
    from pipeline.sinks.config import ParquetSinkConfig
    from pipeline.sinks.parquet import ParquetSink
    from pipeline.sinks.storage import open_storage

    docs = requests(30)
    src = lines_file(tmp_path / "req.jsonl", docs)
    run_etl(job(model, tmp_path / "etl", [src], batch_rows=1, columns=["x"]))
    pipeline = get_pipeline("my-ranker", [entry(model)])
    spec: ModelSpec = pipeline.load_model()
    codec = pipeline.make_codec()
    from pipeline.runtime.session import InferenceSession

    step = ScoringStep(spec, codec, InferenceSession(spec.onnx_path, "cpu", 1))
    cfg = ParquetSinkConfig(enabled=True, path=str(tmp_path / "sink"), columns=["x"], max_open_s=0)
    sink = ParquetSink(cfg, "my-ranker", spec.name, storage=open_storage(str(tmp_path / "sink")), background=False)
    records, rows = [], []
    for i, d in enumerate(docs):
        value = orjson.dumps(d)
        rec = SourceRecord("req.jsonl", 0, i, d["user_id"].encode(), value, {}, d["timestamp_ms"])
        decoded = codec.decode(value)
        (result,), seconds = step.infer([decoded])
        timing = BatchTiming(1, seconds, d["timestamp_ms"] + 5, d["timestamp_ms"] + 6)
        doc = result_document(spec, decoded, rec, result, timing, d["timestamp_ms"] + 1, d["timestamp_ms"] + 100)
        records.append(rec)
        rows.append(ScoredRow(rec, decoded, doc, lambda: None))
    sink.track(records)
    sink.write(rows)
    sink.flush()
    names = sorted(p.relative_to(tmp_path / "sink") for p in (tmp_path / "sink").glob("model=*/**/*.parquet"))
    assert names == sorted(p.relative_to(tmp_path / "etl") for p in (tmp_path / "etl").glob("model=*/**/*.parquet"))
    ours, theirs = read(tmp_path / "etl"), read(tmp_path / "sink")
    assert ours.schema == theirs.schema
    for name in ours.column_names:
        if name not in ("late", "scored_at"):
            assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name
    assert ours.column("late").null_count == ours.num_rows and theirs.column("late").null_count == 0


def test_a_users_job_resumes_to_the_same_files(model: Path, tmp_path: Path) -> None:
    src = lines_file(tmp_path / "req.jsonl", requests(50))
    run_etl(job(model, tmp_path / "whole", [src], chunk_rows=10))
    with pytest.raises(JobInterrupted):
        run_etl(job(model, tmp_path / "resumed", [src], chunk_rows=10, stop_after_chunks=2))
    summary = run_etl(job(model, tmp_path / "resumed", [src], chunk_rows=10))
    assert summary.chunks_skipped == 2 and summary.total_scored == 50

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*.parquet")}

    assert files(tmp_path / "resumed") == files(tmp_path / "whole")


def test_tensor_binary_request_files_are_json_lines(model: Path, tmp_path: Path) -> None:
    """A tensor-binary pipeline's request file holds the JSON form (one line each),
    which decodes to the same arrays: the same results as the tensor-json entry's."""
    src = lines_file(tmp_path / "req.jsonl", requests(12))
    run_etl(job(model, tmp_path / "json", [src]))
    run_etl(job(model, tmp_path / "bin", [src], pipelines=[entry(model, codec="tensor-binary")]))
    assert read(tmp_path / "bin").column("result") == read(tmp_path / "json").column("result")


def test_the_command_on_a_users_model(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "w.yaml"
    config.write_text(yaml.safe_dump({"pipeline": "my-ranker", "pipelines": [entry(model)]}))
    src = lines_file(tmp_path / "req.jsonl", requests(8))
    assert main(["etl", str(src), "-c", str(config), "-o", str(tmp_path / "out"), "--providers", "cpu",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "8 input rows read, 0 rejected, 8 requests scored into 1 Parquet files" in out
    assert "up to 16 rows per ONNX call" in out
    assert main(["etl", str(src), "--pipeline", "nope", "-c", str(config), "-o", str(tmp_path / "o2")]) == 2
    assert "--pipeline 'nope': unknown pipeline" in capsys.readouterr().err
