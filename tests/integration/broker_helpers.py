"""Helpers of the local brokers' tests (tests/integration/test_embedded_broker.py,
test_embedded_clients.py, test_kafka_broker.py, test_broker_nodes.py): consuming and
producing with deadlines, ports and processes, a child's output lines, and the check
that a broker dies with the process that started it. Deadlines, never sleeps."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Consumer, Message, Producer

from consumers.profiles import EMBEDDED, producer_config

REPO = Path(__file__).resolve().parents[2]


# Deadlines, never sleeps: a group join alone costs ~3 s on Tansu (session.timeout / 2).
WAIT_S = 60.0


def consume(consumer: Consumer, count: int, timeout: float = WAIT_S) -> list[Message]:
    """Poll until `count` messages (errors fail the test) or the deadline."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        for message in consumer.consume(num_messages=count - len(got), timeout=0.2):
            assert message.error() is None, message.error()
            got.append(message)
    assert len(got) == count, f"got {len(got)} of {count} messages before the deadline"
    return got


@contextlib.contextmanager
def closing_consumer(config: dict) -> Iterator[Consumer]:
    consumer = Consumer(config)
    try:
        yield consumer
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list]]) -> None:
    producer = Producer(producer_config(EMBEDDED, bootstrap))
    failures: list[str] = []

    def on_delivery(err: object, _msg: Message) -> None:
        if err is not None:
            failures.append(str(err))

    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
        producer.poll(0)
    # One flush at the end, never per message (docs/BROKERS.md: many small batches starve
    # fetches).
    assert producer.flush(WAIT_S) == 0
    producer.close()
    assert failures == []


def wait_until(predicate, timeout: float = WAIT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def port_accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def process_gone(pid: int) -> bool:
    """Gone or a zombie nobody of ours owns (reaping orphans is init's job)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def line_reader(stream) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def next_line_matching(lines: queue.Queue[str], pattern: str, timeout: float = WAIT_S) -> re.Match:
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"no line matching {pattern!r}; output so far: {''.join(seen)!r}")


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def assert_killed_parent_leaves_no_orphan(start_code: str, start_timeout: float = WAIT_S) -> None:
    """Run `start_code` (it starts a broker and prints its pid) in a Python child, SIGKILL
    that child, and wait for the broker process to die with it."""
    code = start_code + "import sys\nsys.stdin.read()\n"  # block until the test kills us
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=subprocess_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        pattern = r"^(\d+)$"
        child_pid = int(next_line_matching(line_reader(parent.stdout), pattern, start_timeout).group(1))
        assert not process_gone(child_pid)
        parent.kill()  # SIGKILL: no atexit, no finalizer runs
        parent.wait(timeout=WAIT_S)
        wait_until(lambda: process_gone(child_pid), what="the orphaned broker to die")
    finally:
        parent.kill()
        parent.wait()
