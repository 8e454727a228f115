"""`tidebatch broker --engine kafka` as a cluster that can be faulted (issue 49): a node
killed under the running command is reported with its own log and the command runs on;
`tidebatch broker node start|stop N` bring nodes back with their data
(consumers/brokers/node_supervisor.py, node_control.py; docs/BROKERS.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from consumers.profiles import KAFKA, admin_config, consumer_config, producer_config
from tests.integration.broker_helpers import REPO, line_reader, next_line_matching, subprocess_env

pytestmark = pytest.mark.integration

START_S = 180.0  # three JVMs on a loaded 2-core machine took 15-19 s; leave room
WAIT_S = 60.0


def broker_command(workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "broker", "--engine", "kafka", *args,
         "--log-file", str(workdir / "broker.log")],  # kafka: its folder is the work dir
        cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def node_command(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "broker", "node", *args, "--dir", str(workdir)],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=180,
    )


def node_states(workdir: Path) -> dict[int, tuple[str, int | None]]:
    """{node: (state, pid)} as `tidebatch broker node status` prints them."""
    done = node_command(workdir, "status")
    assert done.returncode == 0, done.stderr
    states = {}
    for line in done.stdout.splitlines()[1:]:
        m = re.match(r"node (\d): (\w+) +pid (\d+|-), port (\d+)", line)
        assert m, line
        states[int(m.group(1))] = (m.group(2), None if m.group(3) == "-" else int(m.group(3)))
    return states


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer(producer_config(KAFKA, bootstrap, {"acks": "all"}))
    failures: list[str] = []
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % 3,
                         on_delivery=lambda err, _m: failures.append(str(err)) if err else None)
    assert producer.flush(WAIT_S) == 0
    assert failures == []


def read_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = Consumer(consumer_config(KAFKA, bootstrap, f"nodes-{uuid.uuid4().hex[:8]}",
                                        {"auto.offset.reset": "earliest", "enable.auto.commit": False}))
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def in_sync(bootstrap: str, topic: str) -> bool:
    """Every partition led, with all three replicas in its ISR."""
    metadata = AdminClient(admin_config(bootstrap)).list_topics(topic, timeout=10)
    parts = metadata.topics[topic].partitions.values()
    return bool(parts) and all(p.leader >= 0 and sorted(p.isrs) == sorted(p.replicas) == [1, 2, 3] for p in parts)


def wait_in_sync(bootstrap: str, topic: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not in_sync(bootstrap, topic):
        assert time.monotonic() < deadline, f"{topic} not in sync within {WAIT_S:g} s"
        time.sleep(0.5)


def test_a_killed_node_is_reported_and_started_again_with_its_data(tmp_path: Path) -> None:
    workdir = tmp_path / "kafka"
    topic = f"nodes-{uuid.uuid4().hex[:8]}"
    proc = broker_command(workdir, "--nodes", "3", "--topic", f"{topic}:3")
    try:
        lines = line_reader(proc.stdout)
        bootstrap = next_line_matching(lines, r"listening on (\S+) — log: ", timeout=START_S).group(1)
        next_line_matching(lines, rf"^nodes: `tidebatch broker node .* --dir {re.escape(str(workdir))}`")
        before = [f"before-{i}".encode() for i in range(300)]
        produce(bootstrap, topic, before)

        states = node_states(workdir)
        assert {n: s for n, (s, _) in states.items()} == {1: "running", 2: "running", 3: "running"}
        pid2 = states[2][1]
        assert pid2 is not None
        os.kill(pid2, signal.SIGKILL)  # the JVM itself, as a crash would
        died = next_line_matching(lines, r"^Apache Kafka node (\d) died .*\((killed by SIGKILL)\); data kept; log: (\S+)$")
        # It used to stop the whole cluster, naming node 1's log, and delete node 2's data.
        assert died.group(1) == "2"
        assert died.group(3) == str(workdir / "node-2" / "server.log")
        assert proc.poll() is None
        assert node_states(workdir)[2] == ("dead", None)
        assert (workdir / "node-2" / "data").is_dir()

        started = node_command(workdir, "start", "2")
        assert started.returncode == 0, started.stderr
        assert re.match(r"node 2 running after [\d.]+ s \(pid \d+, port \d+\)", started.stdout), started.stdout
        next_line_matching(lines, r"^Apache Kafka node 2 running \(pid \d+, port \d+\), ready in")
        wait_in_sync(bootstrap, topic)

        # A controlled stop of another node, writes meanwhile (min.insync.replicas 2), back.
        stopped = node_command(workdir, "stop", "3")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith("node 3 stopped after"), stopped.stdout
        next_line_matching(lines, r"^Apache Kafka node 3 stopped as asked .*; data kept; log: .*node-3/server\.log$")
        after = [f"after-{i}".encode() for i in range(100)]
        produce(bootstrap, topic, after)
        assert node_command(workdir, "start", "3").returncode == 0
        wait_in_sync(bootstrap, topic)
        assert sorted(read_all(bootstrap, topic, 400)) == sorted(before + after)

        refused = node_command(workdir, "start", "3")
        assert (refused.returncode, refused.stderr) == (2, "tidebatch: error: node 3 is running, not stopped or dead\n")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
        next_line_matching(lines, r"^SIGTERM: stopped 3 Apache Kafka node\(s\) in [\d.]+ s; data deleted")
        gone = node_command(workdir, "status")
        assert gone.returncode == 2 and "no broker command is running" in gone.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_command_ends_when_its_last_node_dies(tmp_path: Path) -> None:
    workdir = tmp_path / "kafka"
    proc = broker_command(workdir)
    try:
        lines = line_reader(proc.stdout)
        next_line_matching(lines, r"listening on ", timeout=START_S)
        next_line_matching(lines, r"^nodes: ")
        (_, pid), = node_states(workdir).values()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=WAIT_S) == 2
        next_line_matching(lines, rf"^Apache Kafka node 1 died .*; data kept; log: {re.escape(str(workdir))}/node-1/server.log$")
        next_line_matching(lines, r"^tidebatch: error: no Apache Kafka node left; logs in .*: node 1 dead \(killed by SIGKILL\)$")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
