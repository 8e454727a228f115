"""`tidebatch run --processes 2` with the children sharing one model host
(runtime.shared_model_host, pipeline/runtime/shared_host.py), on Apache Kafka: every
request is scored, the host's counters show on the parent's one port, and a model host
SIGKILLed mid-backlog is started again by the supervisor while the children's batches
in flight are retried, with no request lost or dead-lettered, and scores what comes after. Timings are never asserted."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from pipeline.ops.stats import from_text
from pipeline.profiling.calibration import descendants
from tests.integration import opsutil
from tests.integration.test_processes import BACKLOG, PARTITIONS, note, shared, start_host, wait

pytestmark = pytest.mark.integration


def model_host_pids(parent: int) -> list[int]:
    """The shared model host among the parent's children (its command line says so)."""
    found = []
    for pid in descendants(parent):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"pipeline.runtime.model_host" in cmd and b"--listen" in cmd:
            found.append(pid)
    return found


def counter(text: str, name: str, **labels: str) -> float:
    """A series of the host's /metrics text, summed over the labels not given."""
    series = from_text(text).get(name, {})
    return sum(v for key, v in series.items() if set(labels.items()) <= set(key))


def test_children_share_one_model_host_that_survives_a_sigkill(kafka_broker, kafka_topic_factory, unique_group_id,
                                                               tmp_path) -> None:
    topics = opsutil.make_topics(kafka_topic_factory, PARTITIONS)
    host = start_host(kafka_broker, topics, unique_group_id, tmp_path, "host",
                      TIDEBATCH_RUNTIME__SHARED_MODEL_HOST="true")
    collector = opsutil.ResultCollector(kafka_broker.bootstrap_servers, topics.output)
    try:
        wait(host, lambda: shared(host), 120, "two processes sharing every partition")
        [first_host] = model_host_pids(host.proc.pid)
        ids = opsutil.produce_ctr(kafka_broker.bootstrap_servers, topics.input, BACKLOG, seed=48)
        wait(host, lambda: len(ids) - len(collector.missing(ids)) >= 100, 60, "the first results")
        _, _, before = opsutil.http_get(host.url + "/metrics")
        assert counter(before, "tidebatch_model_host_calls_total") > 0, before[-2000:]
        os.kill(first_host, signal.SIGKILL)  # mid-backlog: a drain here takes seconds

        def new_host_answers() -> bool:
            _, _, text = opsutil.http_get(host.url + "/metrics")
            return counter(text, "tidebatch_model_host_up") == 1.0 and model_host_pids(host.proc.pid) != [first_host]

        wait(host, new_host_answers, 60, "a new model host answering")
        # More after the restart: these can only be scored by the new host.
        ids += opsutil.produce_ctr(kafka_broker.bootstrap_servers, topics.input, 2000, seed=49, start=BACKLOG)
        wait(host, lambda: not collector.missing(ids), 180, "a result for each request")
        _, _, text = opsutil.http_get(host.url + "/metrics")
        assert counter(text, "tidebatch_model_host_requests_total") > 0
        assert counter(text, "tidebatch_records_total", outcome="dlq") == 0
        code = host.stop()
        assert code == 0, host.log_tail(60)
    finally:
        collector.close()
        host.kill()
    log = host.log_path.read_text()
    assert "one model host for every process" not in log  # true, not auto: the setting is named
    assert "runtime.shared_model_host true" in log, log[-3000:]
    note({"test": "shared_host_sigkill", "requests": len(ids), "missing": 0, "duplicates": collector.duplicates()})
