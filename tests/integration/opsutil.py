"""Helpers for the ops tests: a real Worker with its ops server in this process, or
real `tidebatch run` worker processes; producing CTR requests and collecting results;
polling with deadlines (never fixed sleeps, never timing assertions)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from confluent_kafka import Consumer, Producer

from consumers.brokers.embedded import LocalBroker, free_port
from consumers.profiles import consumer_config, producer_config
from pipeline.config import WorkerConfig, load_config
from pipeline.ops.http import OpsServer
from pipeline.registry.pipelines import get_pipeline
from tests.integration.pipeline_helpers import profile_of

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    last: T = check()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")
        time.sleep(interval)
        last = check()
    return last


def http_get(
    url: str, timeout: float = 5.0, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str, str]:
    """(status, content type, body); HTTP errors are answers too, not exceptions.
    `context`: the TLS trust for an https:// worker (metrics.tls)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def get_json(url: str, context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    status, _, body = http_get(url, context=context)
    return status, json.loads(body)


# ----------------------------------------------------------------------------- topics
@dataclass
class Topics:
    input: str
    output: str
    dlq: str
    late: str


def make_topics(topic_factory: Callable[..., str], partitions: int) -> Topics:
    inp = topic_factory("ops-req", partitions)
    return Topics(inp, topic_factory("ops-res", partitions), topic_factory("ops-dlq", 1), topic_factory("ops-late", 1))


def worker_config(broker: LocalBroker, topics: Topics, group_id: str, **extra: Any) -> WorkerConfig:
    """A validated config for `broker` (with its profile); `extra` is merged like YAML keys."""
    data: dict[str, Any] = {
        "pipeline": "ctr",
        "bootstrap_servers": broker.bootstrap_servers,
        "broker_profile": broker.profile,
        "group_id": group_id,
        "input_topic": topics.input,
        "output_topic": topics.output,
        "dlq_topic": topics.dlq,
        "late_topic": topics.late,
        "create_topics": False,
        "metrics": {"host": "127.0.0.1", "port": 0},
    }
    data.update(extra)
    return load_config(overrides=data, environ={})


# ----------------------------------------------------------------------------- workers
@dataclass
class LiveWorker:
    worker: Any
    server: OpsServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        return self.server.url

    def run(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.worker.stop("test done")
        if self.thread.is_alive():
            self.thread.join(timeout=60)


@contextlib.contextmanager
def live_worker(cfg: WorkerConfig, *, start: bool = True, hooks: list | None = None) -> Iterator[LiveWorker]:
    """A real Worker (source loop in a thread) with its ops server on a free port. With
    start=False the server answers but run() has not begun: call .run()."""
    from pipeline.app.compose import build_worker

    worker = build_worker(cfg, hooks=hooks)
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    server = OpsServer(worker, cfg.metrics.host, cfg.metrics.port, source_thread=thread).start()
    live = LiveWorker(worker, server, thread)
    try:
        if start:
            live.run()
        yield live
    finally:
        live.stop()
        server.stop()


def wait_ready(url: str, timeout: float = 60.0, context: ssl.SSLContext | None = None) -> dict:
    def ready() -> dict | None:
        try:
            status, body = get_json(url + "/readyz", context)
        except OSError:
            return None
        return body if status == 200 else None

    return wait_for(ready, timeout, f"{url}/readyz to answer 200")


@dataclass
class WorkerProcess:
    """A `tidebatch run` subprocess with its ops endpoints on a free port."""

    proc: subprocess.Popen
    url: str
    log_path: Path
    name: str = field(default="worker")

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def assigned(self) -> list[tuple[str, int]] | None:
        """Partitions the worker reports, None while it does not answer."""
        try:
            _, stats = get_json(self.url + "/api/stats")
        except (OSError, ValueError):
            return None
        return [(t, int(p)) for t, p in stats["worker"]["assigned"]]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait: the worker finishes in-flight work, commits, leaves."""
        self.kill(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout:g} s:\n{self.log_tail()}") from None


def start_worker_process(
    broker: LocalBroker, topics: Topics, group_id: str, log_dir: Path, name: str, *,
    pipeline: str = "ctr", args: tuple[str, ...] = (), prefix: tuple[str, ...] = (),
    metrics_host: str = "127.0.0.1", **env: str,
) -> WorkerProcess:
    """`broker` is any LocalBroker (Tansu or Apache Kafka; the worker gets its profile);
    `args` are extra `tidebatch run` flags; `env` adds or overrides variables. `prefix`
    runs the command through another (tests/integration/netns.py: `ip netns exec NS`),
    with the ops endpoints on `metrics_host` (an address this namespace reaches)."""
    port = free_port()
    cmd = [
        *prefix, sys.executable, "-m", "pipeline.cli", "run", "--pipeline", pipeline,
        "--bootstrap-servers", broker.bootstrap_servers, "--broker-profile", broker.profile, *args,
        "--group-id", group_id, "--input-topic", topics.input, "--output-topic", topics.output,
        "--metrics-port", str(port),
    ]
    full_env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TIDEBATCH_DLQ_TOPIC": topics.dlq,
        "TIDEBATCH_LATE_TOPIC": topics.late,
        "TIDEBATCH_CREATE_TOPICS": "false",
        "TIDEBATCH_METRICS__HOST": metrics_host,
        **env,
    }
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    # With metrics.tls the port speaks HTTPS only (pipeline/ops/http_tls.py).
    scheme = "https" if full_env.get("TIDEBATCH_METRICS__TLS__CERT_FILE") else "http"
    return WorkerProcess(proc, f"{scheme}://{metrics_host}:{port}", log_path, name)


# ----------------------------------------------------------------------------- traffic
def produce_ctr(bootstrap: str, topic: str, count: int, *, seed: int = 7, start: int = 0) -> list[str]:
    """Send `count` CTR requests as fast as the producer batches them; returns their
    request ids. Batched by the producer (linger), never flushed per message: the
    embedded broker's fetch slows with every stored batch (docs/BROKERS.md)."""
    make = get_pipeline("ctr").make_samples(seed)
    producer = Producer(producer_config(profile_of(bootstrap), bootstrap))
    ids: list[str] = []
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(start, start + count):
        key, value, headers = make(i)
        ids.append(orjson.loads(value)["request_id"])
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers or None, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(30)
    assert left == 0 and not errors, f"{left} unacknowledged, errors: {errors[:3]}"
    return ids


class ConsumerThread:
    """Reads a confluent Consumer in a thread until close(), handing each record
    without an error to _add() (subclasses set their state up before this __init__)."""

    def __init__(self, consumer: Consumer, name: str) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = consumer
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                for m in self._consumer.consume(num_messages=500, timeout=0.1):
                    if m.error() is None:
                        self._add(m)
        finally:
            self._consumer.close()

    def _add(self, m: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class ResultCollector(ConsumerThread):
    """Reads a result topic in a thread, like any downstream consumer: request id ->
    number of results seen (more than one after a replay), and the input partition
    of each."""

    def __init__(self, bootstrap: str, topic: str, *, profile: str | None = None) -> None:
        self.counts: dict[str, int] = {}
        self.partition: dict[str, int] = {}
        conf = consumer_config(profile or profile_of(bootstrap), bootstrap, f"ops-results-{uuid.uuid4().hex[:10]}")
        consumer = Consumer(conf)
        consumer.subscribe([topic])
        super().__init__(consumer, "results")

    def _add(self, m: Any) -> None:
        doc = orjson.loads(m.value())
        rid = doc["request_id"]
        with self._lock:
            self.counts[rid] = self.counts.get(rid, 0) + 1
            self.partition[rid] = doc["source"]["partition"]

    def missing(self, ids: list[str]) -> list[str]:
        with self._lock:
            return [i for i in ids if i not in self.counts]

    def duplicates(self) -> int:
        with self._lock:
            return sum(n - 1 for n in self.counts.values())

    def duplicated(self) -> dict[str, int]:
        """Request id -> results seen, for those seen more than once."""
        with self._lock:
            return {rid: n for rid, n in self.counts.items() if n > 1}
