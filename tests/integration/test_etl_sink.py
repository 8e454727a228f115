"""The Parquet sink inside a real `tidebatch run` worker: killed with SIGKILL mid-stream
and restarted, the sink still holds exactly one row per (request_id, item_id) — nothing
lost, nothing twice — and DuckDB and pandas read it. With delivery exactly_once
(docs/DELIVERY.md) also: the files finished before the kill are never written again
(same files, same bytes), and a read_committed reader sees one result per request."""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import duckdb
import orjson
import pandas as pd
import pytest

from consumers.brokers.embedded import EmbeddedBroker
from pipeline.loadgen.ctr import CtrRequestFactory
from tests.integration.pipeline_helpers import (
    QUICK_EVICTION_ENV,
    produce_values,
    read_topic,
    result_docs,
    start_worker_process,
    wait_for,
)


def sink_env(root: Path) -> dict[str, str]:
    return {
        "TIDEBATCH_SINKS__PARQUET__ENABLED": "true",
        "TIDEBATCH_SINKS__PARQUET__PATH": str(root),
        "TIDEBATCH_SINKS__PARQUET__ROLL_ROWS": "3000",  # ~150 requests per file
        "TIDEBATCH_SINKS__PARQUET__MAX_OPEN_S": "1",
        "TIDEBATCH_SINKS__PARQUET__COLUMNS": "[I1, C14]",
    }


def parquet_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.parquet"))


def file_digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in parquet_files(root)}


DELIVERY_ENV = {
    "at_least_once": {},
    # A transaction commit flushes the sinks: 500 ms keeps the files from being tiny.
    "exactly_once": {"TIDEBATCH_DELIVERY": "exactly_once", "TIDEBATCH_TRANSACTION_INTERVAL_MS": "500"},
}


@pytest.mark.parametrize("delivery", list(DELIVERY_ENV))
def test_sigkill_and_restart_leave_exactly_one_row_per_item(
    broker, topic_factory, unique_group_id, tmp_path: Path, delivery: str
) -> None:
    if delivery == "exactly_once" and isinstance(broker, EmbeddedBroker):
        pytest.skip("exactly_once needs Apache Kafka (docs/DELIVERY.md)")
    n = 3000
    inp = topic_factory("etl-sink", partitions=2)
    out = topic_factory("etl-sink-scores", partitions=2)
    topic_factory(f"{inp}.dlq", exact=True)
    topic_factory(f"{inp}.late", exact=True)
    factory = CtrRequestFactory(seed=31)
    requests = [factory.make(i) for i in range(n)]
    items = {orjson.loads(v)["request_id"]: len(orjson.loads(v)["items"]) for _, v in requests}
    root = tmp_path / "sink"
    log = tmp_path / "worker.log"
    env = {**sink_env(root), **DELIVERY_ENV[delivery], "TIDEBATCH_TRANSACTIONAL_ID": unique_group_id,
           **QUICK_EVICTION_ENV}
    first = start_worker_process(broker.bootstrap_servers, inp, out, unique_group_id, log, **env)
    try:
        # The first half, then a kill once some files are finished. The worker may well
        # score all of it before the kill lands (a 1500-request backlog takes it well
        # under a second), so the second half is sent while it is down: the restart
        # has to replay the unfinished files and then carry on.
        produce_values(broker.bootstrap_servers, inp, requests[: n // 2])
        wait_for(lambda: len(parquet_files(root)) >= 2, 120, f"no Parquet files before the kill; see {log}")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    at_kill = file_digests(root)
    files_at_kill = len(at_kill)
    produce_values(broker.bootstrap_servers, inp, requests[n // 2 :])
    second = start_worker_process(broker.bootstrap_servers, inp, out, unique_group_id, log, **env)
    try:
        docs: list[dict] = []

        def all_scored() -> bool:
            docs[:] = result_docs(read_topic(broker.bootstrap_servers, out, 10**9, timeout=1))
            return {d["request_id"] for d in docs} >= set(items)

        wait_for(all_scored, 180, f"requests missing after restart; see {log}", interval=0.5)
    finally:
        second.send_signal(signal.SIGTERM)  # finishes the open files, then commits
        assert second.wait(60) == 0, f"see {log}"
    assert len(parquet_files(root)) > files_at_kill
    if delivery == "exactly_once":
        # read_topic reads read_committed (librdkafka's default): one result per request.
        assert len(docs) == n, f"{len(docs) - n} results more than requests"
        # The replay after the kill adopted what was durable: not one file rewritten.
        after = file_digests(root)
        assert {name: after.get(name) for name in at_kill} == at_kill

    glob = f"{root}/**/*.parquet"
    con = duckdb.connect()
    total, distinct, requests_seen = con.execute(
        f"SELECT count(*), count(DISTINCT (request_id, item_id)), count(DISTINCT request_id) "
        f"FROM read_parquet('{glob}', hive_partitioning = true)"
    ).fetchone()
    assert total == distinct == sum(items.values())
    assert requests_seen == n
    per_request = dict(
        con.execute(
            f"SELECT request_id, count(*) FROM read_parquet('{glob}', hive_partitioning = true) GROUP BY 1"
        ).fetchall()
    )
    assert per_request == items
    # offsets are contiguous per partition file after file, in order
    ranges = con.execute(
        f"SELECT source_partition, filename, min(source_offset), max(source_offset) "
        f"FROM read_parquet('{glob}', filename = true) GROUP BY 1, 2 ORDER BY 1, 3"
    ).fetchall()
    for (p1, _, _, hi), (p2, _, lo, _) in zip(ranges, ranges[1:], strict=False):
        if p1 == p2:
            assert lo == hi + 1

    frame = pd.read_parquet(root)
    assert len(frame) == total
    assert set(frame["model"].astype(str)) == {"ctr_deepfm"}
    assert {"I1", "C14", "score", "record_ts", "source_offset", "date", "hour"} <= set(frame.columns)
    assert frame["score"].between(0, 1).all()
