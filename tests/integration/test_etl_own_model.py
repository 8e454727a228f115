"""`tidebatch etl` on pipelines other than ctr (pipeline/etl/pipelines.py, requests.py):
a user's LightGBM model from a `pipelines:` entry over a file of requests and over a
topic range on Apache Kafka, each result bit-identical to ONNX Runtime on that request
alone with one intra-op thread, each row the one the worker's Parquet sink writes for
it, each bad request rejected with the worker's dead-letter reason; and the shipped
camera pipeline over a topic range (its frames cannot be lines of a file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow.dataset as ds
import pytest
import yaml
from confluent_kafka import KafkaException, Producer

from consumers.dead_letter import H_ERROR
from consumers.profiles import producer_config
from tests.integration.pipeline_helpers import REPO, committed_offsets, read_topic, wait_for

pytest.importorskip("lightgbm")
pytest.importorskip("onnxmltools")

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
KEEP = {"retention.ms": "-1"}  # records stamped T0 outlive a 7-day retention (test_etl_job.py)
BAD = {  # line (or record) number -> request and the worker's reason
    7: ({"request_id": "bad-missing", "feature": [0.1, 0.2, 0.3, 0.4, 0.5]}, "missing field 'features'"),
    33: ({"request_id": "bad-size", "features": [0.1, 0.2, 0.3, 0.4]}, "features: dimension 1 must have size 5, got 4"),
    61: ({"request_id": "bad-type", "features": [0.1, "x", 0.3, 0.4, 0.5]},
         "features[1]: expected int or float, got string"),
}


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.own_models import lightgbm_classifier

    return lightgbm_classifier(tmp_path_factory.mktemp("churn") / "churn.onnx")


def requests(n: int) -> list[dict]:
    """n requests, the bad ones at their numbers; user_id and timestamp_ms as a
    producer would set the record's key and timestamp."""
    rng = np.random.default_rng(12)
    out = [{"request_id": f"c{i}", "features": np.round(rng.standard_normal(5) * 1.5, 4).tolist(),
            "user_id": f"u{i % 7}", "timestamp_ms": T0 + 1000 * i} for i in range(n)]
    for at, (doc, _) in BAD.items():
        out[at] = {**doc, "user_id": f"u{at % 7}", "timestamp_ms": T0 + 1000 * at}
    return out


def write_config(path: Path, model: Path, **more: object) -> Path:
    entry = {"name": "churn", "model": str(model), "version": "7",
             "outputs": {"predicted": "label", "scores": "probabilities"}, "max_batch_rows": 64}
    path.write_text(yaml.safe_dump({"pipeline": "churn", "pipelines": [entry], **more}))
    return path


def etl(*args: str) -> subprocess.CompletedProcess:
    """The command itself, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "etl", *args, "--providers", "cpu", "--no-progress"],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          timeout=300)


def read(root: Path):  # noqa: ANN201 - a pyarrow Table
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table().sort_by(
        [("source_partition", "ascending"), ("source_offset", "ascending")])


def rejects(root: Path) -> dict[str, str]:
    lines = [json.loads(x) for f in sorted((root / "_rejects").glob("*.jsonl")) for x in f.read_text().splitlines()]
    return {r["value"]["request_id"] if isinstance(r["value"], dict) else orjson.loads(r["value"])["request_id"]:
            r["reason"] for r in lines}


def assert_bits_of_onnx_runtime_alone(model: Path, table, docs: dict[str, dict]) -> None:  # noqa: ANN001
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    classes = set()
    for row in table.to_pylist():
        result = orjson.loads(row["result"])
        label, probabilities = session.run(None, {"features": np.array([docs[row["request_id"]]["features"]], np.float32)})
        assert result["predicted"] == int(label[0])
        want = probabilities[0]
        assert list(result["scores"]) == [str(k) for k in want]
        got = np.array(list(result["scores"].values()), np.float32)
        assert got.tobytes() == np.array(list(want.values()), np.float32).tobytes(), (row["request_id"], result, want)
        classes.add(result["predicted"])
    assert classes == {0, 1, 2}  # not one constant compared over and over


def test_a_request_file_of_a_users_model(churn: Path, tmp_path: Path) -> None:
    docs = requests(120)
    src = tmp_path / "churn.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(d) for d in docs) + b"\n")
    config = write_config(tmp_path / "churn.yaml", churn)
    done = etl(str(src), "-c", str(config), "-o", str(tmp_path / "out"), "--chunk-rows", "50")
    assert done.returncode == 0, done.stderr
    assert "120 input rows read, 3 rejected, 117 requests scored" in done.stdout
    table = read(tmp_path / "out")
    good = {d["request_id"]: d for i, d in enumerate(docs) if i not in BAD}
    assert sorted(table.column("request_id").to_pylist()) == sorted(good)
    assert max(table.column("batch_rows").to_pylist()) > 1  # requests shared calls
    assert_bits_of_onnx_runtime_alone(churn, table, good)
    assert rejects(tmp_path / "out") == {doc["request_id"]: reason for doc, reason in BAD.values()}


def test_a_topic_range_of_a_users_model_gives_the_workers_sink_rows(
    kafka_broker, kafka_topic_factory, unique_group_id, churn: Path, tmp_path: Path
) -> None:
    """`tidebatch run` (its Parquet sink on) and then `tidebatch etl --topic` over the
    same records, from the same config: the same rows, but for batch_rows (the worker's
    batches are its own) and what describes a run of the worker (late, scored_at)."""
    bootstrap = kafka_broker.bootstrap_servers
    inp, out = kafka_topic_factory("etl-own-req", partitions=2, config=KEEP), kafka_topic_factory("etl-own-res", partitions=2)
    dlq = kafka_topic_factory(f"{inp}.dlq", exact=True)
    config = write_config(tmp_path / "churn.yaml", churn, input_topic=inp, output_topic=out, dlq_topic=dlq,
                          sinks={"parquet": {"enabled": True, "path": str(tmp_path / "sink"), "max_open_s": 1}})
    docs = requests(160)
    producer = Producer(producer_config("kafka", bootstrap))
    for i, d in enumerate(docs):
        producer.produce(inp, key=d["user_id"].encode(), value=orjson.dumps(d), partition=i % 2,
                         timestamp=d["timestamp_ms"])
    assert producer.flush(30) == 0
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "run", "-c", str(config), "--bootstrap-servers", bootstrap,
             "--broker-profile", "kafka", "--group-id", unique_group_id],
            stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO), TIDEBATCH_METRICS__ENABLED="false", TIDEBATCH_CREATE_TOPICS="false"),
        )
    def all_committed() -> bool:
        try:
            return sum(committed_offsets(bootstrap, unique_group_id, inp, 2).values()) == len(docs)
        except KafkaException:  # NOT_COORDINATOR while a fresh broker loads its group state
            return False

    try:  # the sink acks a row once its file is durable: committed means written
        wait_for(all_committed, 120, f"the worker never committed every request; see {log}", interval=0.5)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    assert worker.returncode == 0, f"see {log}"
    dead = read_topic(bootstrap, dlq, len(BAD), timeout=30)

    done = etl("--topic", inp, "-c", str(config), "--bootstrap-servers", bootstrap, "--broker-profile", "kafka",
               "-o", str(tmp_path / "etl"), "--chunk-records", "40")
    assert done.returncode == 0, done.stderr
    assert "160 records read, 3 rejected, 157 requests scored" in done.stdout
    ours, sink = read(tmp_path / "etl"), read(tmp_path / "sink")
    assert ours.schema == sink.schema and ours.num_rows == sink.num_rows == len(docs) - len(BAD)
    for name in ours.column_names:
        if name not in ("batch_rows", "late", "scored_at"):
            assert ours.column(name).to_pylist() == sink.column(name).to_pylist(), name
    assert ours.column("scored_at").null_count == ours.num_rows
    good = {d["request_id"]: d for i, d in enumerate(docs) if i not in BAD}
    assert_bits_of_onnx_runtime_alone(churn, ours, good)
    worker_reasons = {orjson.loads(m.value())["request_id"]: dict(m.headers())[H_ERROR].decode() for m in dead}
    assert rejects(tmp_path / "etl") == worker_reasons == {doc["request_id"]: r for doc, r in BAD.values()}


def test_a_topic_range_of_camera_frames(broker, topic_factory, tmp_path: Path) -> None:
    """The shipped camera pipeline, whose frames carry their fields in headers: scored
    from a topic range, one row per frame with its detections; a frame that is no image
    is rejected with the codec's reason."""
    from pipeline.registry.pipelines import get_pipeline

    topic = topic_factory("etl-camera", partitions=1, config=KEEP)
    camera = get_pipeline("camera")
    make = camera.make_samples(5)
    frames = [make(i) for i in range(6)]
    producer = Producer(producer_config(broker.profile, broker.bootstrap_servers))
    for i, (key, value, headers) in enumerate(frames):
        producer.produce(topic, key=key, value=b"not an image" if i == 2 else value, headers=headers,
                         timestamp=T0 + i)
    assert producer.flush(30) == 0
    done = etl("--pipeline", "camera", "--topic", topic, "--bootstrap-servers", broker.bootstrap_servers,
               "--broker-profile", broker.profile, "-o", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "6 records read, 1 rejected, 5 requests scored" in done.stdout
    table = read(tmp_path / "out")
    assert table.column("source_offset").to_pylist() == [0, 1, 3, 4, 5]
    results = [orjson.loads(r) for r in table.column("result").to_pylist()]
    assert all({"camera_id", "frame_id", "detections"} <= set(r) for r in results)
    assert set(table.column("model").to_pylist()) == {camera.load_model().name}
    (line,) = (tmp_path / "out" / "_rejects").glob("*.jsonl")
    assert json.loads(line.read_text())["offset"] == 2
