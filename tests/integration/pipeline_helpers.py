"""Helpers for end-to-end tests: produce requests, run a worker (in a thread or as a
`tidebatch run` process), read a topic back. Every helper takes the broker profile
(consumers/profiles.py); by default, the profile of the broker at that bootstrap
address, as the fixtures registered it (tests/integration/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer

from consumers.profiles import EMBEDDED, consumer_config, producer_config
from pipeline.app.compose import build_worker
from pipeline.config import WorkerConfig, load_config

REPO = Path(__file__).resolve().parents[2]
# For a test that SIGKILLs a worker and starts another in its group: the killed one stays
# a member for its session timeout, and the new one gets no partition until it is gone.
# 6 s, the embedded profile's, not the 45 s librdkafka and kafka-python default to on
# Apache Kafka (consumers/profiles.py): the test waited those out.
QUICK_EVICTION_ENV = {"TIDEBATCH_SESSION_TIMEOUT_MS": "6000"}
_PROFILES: dict[str, str] = {}  # bootstrap address -> profile of the broker there


def register_broker(broker: Any) -> None:
    """Remember the profile of a broker the fixtures started."""
    _PROFILES[broker.bootstrap_servers] = broker.profile


def profile_of(bootstrap: str, profile: str | None = None) -> str:
    """`profile` if given, else that of the registered broker at `bootstrap`."""
    return profile or _PROFILES.get(bootstrap, EMBEDDED)


def produce_values(
    bootstrap: str,
    topic: str,
    items: Iterable[tuple[bytes | None, bytes | None]],
    headers=None,
    *,
    profile: str | None = None,
) -> int:
    producer = Producer(producer_config(profile_of(bootstrap, profile), bootstrap))
    n = 0
    for key, value in items:
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
    assert producer.flush(30) == 0
    return n


def read_topic(
    bootstrap: str,
    topic: str,
    expect: int,
    timeout: float = 60.0,
    group: str | None = None,
    *,
    profile: str | None = None,
) -> list[Any]:
    """Read from the beginning until `expect` records arrived (or timeout); returns
    confluent Messages. Assigns partitions directly: a group join costs seconds on the
    embedded broker."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from consumers.admin import existing_topics

    conf = consumer_config(profile_of(bootstrap, profile), bootstrap, group or f"reader-{time.monotonic_ns()}")
    consumer = Consumer(conf)
    partitions = existing_topics(bootstrap)[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expect and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=1000, timeout=0.2):
                if m.error() is None:
                    out.append(m)
    finally:
        consumer.close()
    return out


def result_docs(messages: list[Any]) -> list[dict]:
    return [orjson.loads(m.value()) for m in messages]


def worker_config(
    bootstrap: str, inp: str, out: str, group: str, *, profile: str | None = None, **extra: Any
) -> WorkerConfig:
    overrides = {
        "bootstrap_servers": bootstrap,
        "broker_profile": profile_of(bootstrap, profile),
        "group_id": group,
        "input_topic": inp,
        "output_topic": out,
        "metrics": {"enabled": False},
        "create_topics": False,
        **extra,
    }
    return load_config(overrides=overrides, environ={})


@contextmanager
def running_worker(cfg: WorkerConfig, wait_assigned: bool = True):
    worker = build_worker(cfg)
    exit_code: list[int] = []
    thread = threading.Thread(target=lambda: exit_code.append(worker.run()), daemon=True)
    thread.start()
    if wait_assigned:
        wait_for(lambda: bool(worker.assigned), 60, "worker never got partitions")
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
        assert not thread.is_alive(), "worker did not stop"
    assert exit_code == [0], f"worker exit code {exit_code}"


def wait_for(predicate, timeout: float, message: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(message)


def start_worker_process(
    bootstrap: str, inp: str, out: str, group: str, log: Path, *, profile: str | None = None, **env: str
) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "pipeline.cli", "run", "--pipeline", "ctr",
        "--bootstrap-servers", bootstrap, "--broker-profile", profile_of(bootstrap, profile),
        "--group-id", group, "--input-topic", inp, "--output-topic", out,
    ]
    full_env = dict(os.environ, TIDEBATCH_METRICS__ENABLED="false", TIDEBATCH_CREATE_TOPICS="false", **env)
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)


def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int, *, profile: str | None = None
) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    consumer = Consumer(consumer_config(profile_of(bootstrap, profile), bootstrap, group))
    try:
        parts = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {p.partition: p.offset for p in parts}
    finally:
        consumer.close()
