"""`tidebatch etl` against real inputs: a topic range on the embedded broker (offsets
and record times, bad records rejected, resume), and a file job SIGKILLed mid-run then
resumed, which must end with the files of an uninterrupted run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer

from consumers.profiles import producer_config
from pipeline.etl.job import JobInterrupted, run_etl
from pipeline.etl.settings import EtlJob
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.loadgen.ctr_files import flat_rows_table
from tests.integration.pipeline_helpers import REPO, profile_of, wait_for

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
# Topics of records stamped T0 keep them: under Kafka's 7-day retention.ms the broker's
# 5-minutely check deletes them once T0 is a week old, and in CI (2026-12-05) it did
# between a test's produce and its read ("offset 0 out of range", the log began at 150).
KEEP = {"retention.ms": "-1"}
N = 300
BAD = {37, 150, 251}  # request numbers sent as broken messages instead


def produce_with_times(bootstrap: str, topic: str) -> dict[int, tuple[str, int]]:
    """Request i -> partition i % 2, timestamp T0 + i s. Returns {i: (request_id, items)}."""
    factory = CtrRequestFactory(seed=41)
    producer = Producer(producer_config(profile_of(bootstrap), bootstrap))
    sent = {}
    for i in range(N):
        key, value = factory.make(i)
        if i in BAD:
            value = value[:-9]  # cut short: malformed JSON
        else:
            doc = orjson.loads(value)
            sent[i] = (doc["request_id"], len(doc["items"]))
        producer.produce(topic, key=key, value=value, partition=i % 2, timestamp=T0 + 1000 * i)
    assert producer.flush(30) == 0
    return sent


def topic_job(out: Path, bootstrap: str, topic: str, **kw: object) -> EtlJob:
    params = {"chunk_records": 40, "batch_rows": 512, "providers": "cpu", "progress": False, **kw}
    return EtlJob(output=str(out), topic=topic, bootstrap_servers=bootstrap, broker_profile=profile_of(bootstrap), **params)  # type: ignore[arg-type]


def read(root: Path):  # noqa: ANN201 - a pyarrow Table
    return ds.dataset(str(root), format="parquet", partitioning="hive").to_table()


def hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "_etl" not in p.parts
    }


def rejects(root: Path) -> list[dict]:
    return [json.loads(x) for f in sorted((root / "_rejects").glob("*.jsonl")) for x in f.read_text().splitlines()]


@pytest.fixture
def requests_topic(broker, topic_factory) -> tuple[str, dict[int, tuple[str, int]]]:
    topic = topic_factory("etl-range", partitions=2, config=KEEP)
    return topic, produce_with_times(broker.bootstrap_servers, topic)


def test_topic_range_by_offsets(broker, requests_topic, tmp_path: Path) -> None:
    topic, sent = requests_topic
    summary = run_etl(topic_job(tmp_path / "out", broker.bootstrap_servers, topic, from_offset=10, to_offset=100))
    # partition p holds requests p, p+2, ...: offset o is request 2*o + p
    wanted = {2 * o + p for p in (0, 1) for o in range(10, 100)}
    table = read(tmp_path / "out")
    got = set(table.column("request_id").to_pylist())
    assert got == {sent[i][0] for i in wanted - BAD}
    assert table.num_rows == summary.total_scored == sum(sent[i][1] for i in wanted - BAD)
    offsets = table.column("source_offset").to_pylist()
    assert min(offsets) == 10 and max(offsets) == 99
    assert summary.rejected == len(wanted & BAD) == 2
    assert all(r["reason"].startswith("malformed JSON") for r in rejects(tmp_path / "out"))
    names = sorted(p.name for p in (tmp_path / "out").rglob("*.parquet"))
    assert f"{topic}+0+0000000010.parquet" in names and f"{topic}+1+0000000050.parquet" in names


def test_topic_range_by_record_time(broker, requests_topic, tmp_path: Path) -> None:
    """The embedded broker answers offsets_for_times wrongly (0): the job must still
    keep exactly the records whose timestamps are in [from, to)."""
    topic, sent = requests_topic
    summary = run_etl(
        topic_job(tmp_path / "out", broker.bootstrap_servers, topic, from_ms=T0 + 100_000, to_ms=T0 + 200_000)
    )
    wanted = set(range(100, 200))
    got = set(read(tmp_path / "out").column("request_id").to_pylist())
    assert got == {sent[i][0] for i in wanted - BAD}
    assert summary.rejected == 1  # request 150


def test_topic_job_resumes_to_the_same_files(broker, requests_topic, tmp_path: Path) -> None:
    topic, _ = requests_topic
    run_etl(topic_job(tmp_path / "whole", broker.bootstrap_servers, topic))
    with pytest.raises(JobInterrupted):
        run_etl(topic_job(tmp_path / "resumed", broker.bootstrap_servers, topic, stop_after_chunks=2))
    summary = run_etl(topic_job(tmp_path / "resumed", broker.bootstrap_servers, topic))
    assert summary.chunks_skipped == 2
    assert hashes(tmp_path / "resumed") == hashes(tmp_path / "whole")
    assert read(tmp_path / "whole").num_rows == summary.total_scored


def etl_process(*args: str, log: Path) -> subprocess.Popen:
    boot = (
        "import sys\nfrom pipeline.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-c", boot, "etl", *args], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )


def chunks_done(out: Path) -> int:
    try:
        doc = json.loads((out / "_etl" / "checkpoint.json").read_text())
    except (OSError, ValueError):
        return 0
    return sum(s["chunks"] for s in doc["sources"].values())


def test_file_job_sigkilled_mid_run_then_resumed(tmp_path: Path) -> None:
    src = tmp_path / "requests.parquet"
    pq.write_table(flat_rows_table(seed=9, min_rows=12_000, t0_ms=T0), src)
    args = [str(src), "--chunk-rows", "300", "--batch-rows", "300", "--providers", "cpu", "--no-progress"]
    log = tmp_path / "etl.log"
    whole = etl_process(*args, "-o", str(tmp_path / "whole"), log=log)
    assert whole.wait(300) == 0, log.read_text()[-2000:]
    victim = etl_process(*args, "-o", str(tmp_path / "killed"), log=log)
    try:
        wait_for(lambda: chunks_done(tmp_path / "killed") >= 3 or victim.poll() is not None, 120, "no progress")
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
    finally:
        if victim.poll() is None:
            victim.kill()
    killed_at = chunks_done(tmp_path / "killed")
    total = chunks_done(tmp_path / "whole")
    assert killed_at < total, "the job finished before the kill; make the input bigger"
    t0 = time.monotonic()
    resumed = etl_process(*args, "-o", str(tmp_path / "killed"), log=log)
    assert resumed.wait(300) == 0, log.read_text()[-2000:]
    assert time.monotonic() - t0 < 300
    assert chunks_done(tmp_path / "killed") == total
    assert hashes(tmp_path / "killed") == hashes(tmp_path / "whole")
    assert "finished by an earlier run" in log.read_text()
