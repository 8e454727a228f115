"""Shared pieces of the real-pipeline benchmarks: a broker (Apache Kafka or the embedded
Tansu), fast request pools, a worker in its own process, backlog drains and open-loop
latency runs. Every client here and the worker get the profile of the broker they
talk to (consumers/profiles.py).

Absolute timings on this 2-core machine are noisy; benchmarks report ratios measured
side by side in one run. The worker runs as a separate `tidebatch run` process (its
own GIL, as in production); the benchmark process only produces and reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from consumers.admin import ensure_topics
from consumers.brokers.embedded import EmbeddedBroker, LocalBroker, free_port
from consumers.brokers.kafka import KafkaBroker
from consumers.dead_letter import H_LATE_RULE
from consumers.profiles import consumer_config, producer_config
from consumers.records import H_PRODUCED_MS
from pipeline.app.produce import warm_up_producer
from pipeline.loadgen.pacing import poisson_schedule, run_open_loop
from pipeline.profiling.calibration import ProcessTree, machine_cpu_seconds
from pipeline.profiling.calibration import process_cpu_seconds as cpu_seconds

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out" / "bench"
# --broker: Apache Kafka (what users run; the default) or the embedded Tansu broker.
BROKERS = ("kafka", "tansu")
_PROFILES: dict[str, str] = {}  # bootstrap address -> profile of the broker there
_BROKER_PIDS: dict[str, list[int]] = {}  # bootstrap address -> its broker processes


def profile_of(bootstrap: str) -> str:
    """The broker profile for clients of the broker at `bootstrap` (started here)."""
    return _PROFILES.get(bootstrap, "embedded")


@contextmanager
def local_broker(engine: str = "kafka", settings: dict[str, str] | None = None) -> Iterator[LocalBroker]:
    """A broker of its own for one measurement: Apache Kafka (one node) or Tansu.
    settings: more server.properties for Apache Kafka."""
    if engine not in BROKERS:
        raise ValueError(f"broker {engine!r}: use one of {', '.join(BROKERS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    broker: LocalBroker = EmbeddedBroker(log_path=OUT / "broker.log") if engine == "tansu" else KafkaBroker(settings=settings)
    with broker:
        _PROFILES[broker.bootstrap_servers] = broker.profile
        _BROKER_PIDS[broker.bootstrap_servers] = _pids_of(broker)
        yield broker


def _pids_of(broker: LocalBroker) -> list[int]:
    if isinstance(broker, KafkaBroker):
        return [n.proc.pid for n in broker.nodes if n.proc is not None]
    pid = getattr(broker, "pid", None)
    return [pid] if pid else []


@contextmanager
def cpu_shares(
    bootstrap: str, worker_pid: int, extra: dict[str, int] | None = None, *, machine: bool = False,
) -> Iterator[dict[str, float]]:
    """Cores used while the block runs, by the load generator (this process: the
    bench produces from it), the worker and the broker: on a 2-core machine the
    three share the CPU, and a figure means little without the split. `extra`: more
    processes of the bench to account for, by name (e.g. a reader of the results).
    machine=True adds "others": the rest of the machine's busy cores meanwhile (other
    work on the machine, and kernel time no process was charged for), so a run that
    shared the CPU with something else can be told apart, and "stolen" (by the
    hypervisor of a VM). Filled on exit."""
    brokers = _BROKER_PIDS.get(bootstrap, [])
    extra = extra or {}
    wall0, gen0 = time.monotonic(), time.process_time()
    worker = ProcessTree(worker_pid)  # its children (--processes N, a model process) too
    worker0 = worker.cpu_seconds()
    broker0 = sum(cpu_seconds(p) for p in brokers)
    extra0 = {name: cpu_seconds(pid) for name, pid in extra.items()}
    machine0 = machine_cpu_seconds() if machine else (0.0, 0.0)
    shares: dict[str, float] = {}
    yield shares
    wall = max(time.monotonic() - wall0, 1e-9)
    shares["generator"] = (time.process_time() - gen0) / wall
    shares["worker"] = (worker.cpu_seconds() - worker0) / wall
    shares["broker"] = (sum(cpu_seconds(p) for p in brokers) - broker0) / wall if brokers else float("nan")
    for name, pid in extra.items():
        shares[name] = (cpu_seconds(pid) - extra0[name]) / wall
    if machine:
        busy, stolen = machine_cpu_seconds()
        ours = sum(v for v in shares.values() if v == v)  # not NaN
        shares["others"] = max((busy - machine0[0]) / wall - ours, 0.0)
        shares["stolen"] = (stolen - machine0[1]) / wall


def stages(proc: subprocess.Popen, pipeline: str = "ctr") -> dict[str, dict[str, float | None]]:
    """Where the worker's scored requests spent their time so far (its
    tidebatch_stage_seconds: to_worker, decode, queue, model, publish; p50/p99/mean ms)."""
    from pipeline.app.demo import scrape_text
    from pipeline.ops.stats import from_text, stage_breakdown

    return stage_breakdown(None, from_text(scrape_text(proc.metrics_url)), pipeline)  # type: ignore[attr-defined]


def rules_text(rules: dict[str, int] | None) -> str:
    """`(shed 12, hopeless 3)`: a row's routed requests by rule; empty when none."""
    return "(" + ", ".join(f"{k} {v}" for k, v in sorted(rules.items())) + ")" if rules else ""


def routed_rules(proc: subprocess.Popen) -> dict[str, int]:
    """How many requests the worker routed late so far, by the rule that routed them
    (tidebatch_routed_late_total: expired, shed, overdue, hopeless, over_ceiling)."""
    from pipeline.app.demo import scrape_text
    from pipeline.ops.stats import from_text

    series = from_text(scrape_text(proc.metrics_url)).get("tidebatch_routed_late_total", {})  # type: ignore[attr-defined]
    return {dict(labels)["rule"]: int(v) for labels, v in series.items()}


def stages_text(breakdown: dict[str, dict[str, float | None]]) -> str:
    """'stage p99 ms: to_worker 9, decode 3, queue 40, model 23, publish 28'."""
    return "stage p99 ms: " + ", ".join(
        f"{k} {v['p99_ms']:.0f}" if v.get("p99_ms") is not None else f"{k} -" for k, v in breakdown.items()
    )


def cpu_text(shares: dict[str, float]) -> str:
    """'cores: generator 0.31, worker 0.95, broker 0.40' (cores, not percent)."""
    return "cores: " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items())


class RequestPool:
    """N distinct generated CTR requests, re-used with a fresh request_id each time:
    generating realistic requests costs ~2 ms each in Python, far slower than the
    pipeline, so the load is prepared before the clock starts."""

    def __init__(self, size: int = 2000, seed: int = 11, encoding: str = "json") -> None:
        from pipeline.loadgen.ctr import CtrRequestFactory

        if encoding not in ("json", "binary"):
            raise ValueError(f"encoding must be json or binary, got {encoding!r}")
        factory = CtrRequestFactory(seed=seed)
        self.encoding = encoding
        self.templates: list[tuple[bytes | None, bytes, bytes]] = []
        self.rows: list[int] = []
        for i in range(size):
            key, value = factory.make(i)
            doc = orjson.loads(value)
            rid = f'"request_id":"{doc["request_id"]}"'.encode()
            assert rid in value, "request_id must be serialised compactly"
            self.templates.append((key, value, rid))
            self.rows.append(len(doc["items"]))
        self.mean_rows = float(np.mean(self.rows))

    def get(self, i: int, run: str, priority: int | None = None, tenant: str | None = None) -> tuple[bytes | None, bytes]:
        key, value, rid = self.templates[i % len(self.templates)]
        new = f'"request_id":"{run}-{i}"'
        if priority is not None:
            new = f'"priority":{priority},' + new
        if tenant is not None:
            new = f'"tenant":"{tenant}",' + new
        value = value.replace(rid, new.encode(), 1)
        if self.encoding == "binary":
            from pipeline.codecs.ctr_binary import encode

            value = encode(orjson.loads(value))
        return key, value


def make_producer(bootstrap: str, topic: str, overrides: dict | None = None) -> Producer:
    producer = Producer(producer_config(profile_of(bootstrap), bootstrap, overrides))
    warm_up_producer(producer, topic)
    return producer


def produce_now(producer: Producer, topic: str, key: bytes | None, value: bytes,
                headers: list[tuple[str, bytes]] | None = None) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)


def preload(bootstrap: str, topic: str, pool: RequestPool, n: int, run: str) -> None:
    producer = make_producer(bootstrap, topic)
    for i in range(n):
        produce_now(producer, topic, *pool.get(i, run))
    assert producer.flush(60) == 0


def open_loop(
    bootstrap: str, topic: str, pool: RequestPool, rate_fn: Callable[[float], float] | float,
    duration: float, run: str, seed: int = 3, priority_fn: Callable[[int], int] | None = None,
    producer_overrides: dict | None = None, tenant_fn: Callable[[int], str] | None = None,
    trace: list[tuple[float, int, int]] | None = None,
) -> int:
    """Produce for `duration` s at `rate_fn(t)` req/s (Poisson; a time-varying rate is
    realised by thinning). tenant_fn(i): request i's tenant (request_id RUN-TENANT-i).
    trace: gets (wall-clock s of the produce call, rows, priority) per request, the
    arrival trace `tidebatch simulate --scenario trace:FILE` replays (bench/burst.py)."""
    producer = make_producer(bootstrap, topic, producer_overrides)
    if callable(rate_fn):
        peak = max(rate_fn(t) for t in np.linspace(0, duration, 200))
        rng = np.random.default_rng(seed)
        times = [t for t in poisson_schedule(peak, int(peak * duration * 1.2) + 10, seed) if t < duration]
        times = [t for t in times if rng.random() < rate_fn(t) / peak]
    else:
        times = [t for t in poisson_schedule(rate_fn, int(rate_fn * duration * 1.2) + 10, seed) if t < duration]

    def send(i: int) -> None:
        priority = priority_fn(i) if priority_fn else None
        tenant = tenant_fn(i) if tenant_fn else None
        now = time.time()
        if trace is not None:
            trace.append((now, pool.rows[i % len(pool.rows)], priority or 0))
        # The produce call's own time: on a LogAppendTime input topic the worker splits
        # the produce leg off to_worker with it (to_broker, consumers/records.py).
        stamp = [(H_PRODUCED_MS, str(int(now * 1000)).encode())]
        produce_now(producer, topic, *pool.get(i, f"{run}-{tenant}" if tenant else run, priority, tenant), stamp)
        producer.poll(0)

    sent, _ = run_open_loop(iter(times), send, idle=lambda s: producer.poll(s))
    assert producer.flush(60) == 0
    return sent


@dataclass
class Results:
    docs: list[dict]
    result_ts_ms: np.ndarray  # result record timestamps

    @property
    def latency_ms(self) -> np.ndarray:
        return self.result_ts_ms - np.array([d["kafka_ts_ms"] for d in self.docs], dtype=float)

    def percentiles(self) -> tuple[float, float]:
        lat = self.latency_ms
        return float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def read_request_ids(bootstrap: str, topic: str, run: str, idle_timeout: float = 3.0,
                     rules: dict[str, str] | None = None) -> set[str]:
    """request_ids of this run in a topic of original requests (the late or DLQ topic),
    read until nothing new arrives for idle_timeout. Counted by reading, not by offsets:
    ListOffsets "latest" is wrong on the embedded broker. rules, when given, gets each
    id's late rule header (which rule routed it, consumers/dead_letter.py)."""
    from consumers.admin import existing_topics

    consumer = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"bench-ids-{uuid.uuid4().hex[:8]}"))
    parts = existing_topics(bootstrap)[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    ids: set[str] = set()
    last_new = time.monotonic()
    try:
        while time.monotonic() - last_new < idle_timeout:
            for m in consumer.consume(num_messages=2000, timeout=0.2):
                if m.error() or not m.value():
                    continue
                rid = orjson.loads(m.value()).get("request_id", "")
                if rid.startswith(run + "-") and rid not in ids:
                    ids.add(rid)
                    last_new = time.monotonic()
                    if rules is not None:
                        rules[rid] = dict(m.headers() or []).get(H_LATE_RULE, b"?").decode()
    finally:
        consumer.close()
    return ids


def read_results(bootstrap: str, topic: str, expect: int, timeout: float, run: str | None = None) -> Results:
    """Every result of this run (request ids prefixed with `run`), deduplicated."""
    from consumers.admin import existing_topics

    consumer = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"bench-reader-{uuid.uuid4().hex[:8]}"))
    parts = existing_topics(bootstrap)[topic]
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    seen: dict[str, tuple[dict, int]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < expect and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=2000, timeout=0.2):
                if m.error():
                    continue
                doc = orjson.loads(m.value())
                rid = doc["request_id"]
                if run is not None and not rid.startswith(run + "-"):
                    continue
                seen.setdefault(rid, (doc, m.timestamp()[1]))
    finally:
        consumer.close()
    docs = [d for d, _ in seen.values()]
    ts = np.array([t for _, t in seen.values()], dtype=float)
    return Results(docs, ts)


@contextmanager
def embedded_broker() -> Iterator[LocalBroker]:
    with local_broker("tansu") as broker:
        yield broker


@contextmanager
def worker_process(
    bootstrap: str, inp: str, out: str, policy: str, *, extra_env: dict[str, str] | None = None,
    log_name: str = "worker", pipeline: str = "ctr", config: Path | None = None,
    on_spawn: Callable[[subprocess.Popen], None] | None = None,
) -> Iterator[subprocess.Popen]:
    """A `tidebatch run` process; yields once it has partitions and fetches. config: a
    worker config file, e.g. one whose `pipelines:` define `pipeline`. on_spawn: called
    with the process as soon as it exists, before the wait for partitions (a CPU trace
    that must see all its work: with a preloaded backlog it starts scoring before then)."""
    port = free_port()
    group = f"bench-{policy}-{uuid.uuid4().hex[:8]}"
    env = dict(
        os.environ,
        TIDEBATCH_METRICS__PORT=str(port),
        TIDEBATCH_CREATE_TOPICS="false",
        **(extra_env or {}),
    )
    log = OUT / f"{log_name}.log"
    cmd = worker_command(bootstrap, inp, out, policy, group, pipeline, config)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        if on_spawn is not None:
            on_spawn(proc)
        _wait_assigned(proc, port, log)
        proc.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        proc.group_id = group  # type: ignore[attr-defined]
        proc.log_path = log  # type: ignore[attr-defined]
        yield proc
    finally:
        stop_process(proc)


def worker_command(bootstrap: str, inp: str, out: str, policy: str, group: str, pipeline: str = "ctr",
                   config: Path | None = None) -> list[str]:
    """The `tidebatch run` command line of a bench worker."""
    return [
        sys.executable, "-m", "pipeline.cli", "run", "--pipeline", pipeline, *(["-c", str(config)] if config else []),
        "--bootstrap-servers", bootstrap, "--broker-profile", profile_of(bootstrap),
        "--policy", policy, "--group-id", group, "--input-topic", inp, "--output-topic", out,
    ]


def stop_process(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)  # reaped: no zombie left behind a timed-out bench


def _wait_assigned(proc: subprocess.Popen, port: int, log: Path, timeout: float = 90) -> None:
    from pipeline.app.demo import _sum, scrape

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}; see {log}")
        try:
            if _sum(scrape(f"http://127.0.0.1:{port}/metrics"), "tidebatch_assigned_partitions") > 0:
                time.sleep(1.0)  # the embedded broker's first fetch after a join is slow
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"worker got no partitions in {timeout} s; see {log}")


def wait_outcomes(proc: subprocess.Popen, n: int, timeout: float = 600.0, every: float = 0.2) -> None:
    """Block until the worker reports n final outcomes (scored, late, DLQ, ...), so a
    backlog drain is not slowed by the benchmark reading results at the same time.
    every: seconds between scrapes of its /metrics."""
    from pipeline.app.demo import _sum, scrape

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _sum(scrape(proc.metrics_url), "tidebatch_records_total") >= n:  # type: ignore[attr-defined]
                return
        except OSError:
            pass
        time.sleep(every)
    raise RuntimeError(f"worker reported fewer than {n} outcomes in {timeout} s")


def fresh_topics(bootstrap: str, prefix: str, partitions: int = 2, log_append: bool = False) -> tuple[str, str]:
    """A run's topics. log_append: the input topic stamps records with the broker's
    append time (message.timestamp.type=LogAppendTime; Apache Kafka only, Tansu keeps
    CreateTime, docs/BROKERS.md), so the worker's to_broker stage splits the produce
    leg off to_worker; a request's latency and deadline then count from the append."""
    tag = uuid.uuid4().hex[:6]
    inp, out = f"{prefix}-{tag}.requests", f"{prefix}-{tag}.scores"
    config = {"message.timestamp.type": "LogAppendTime"} if log_append else None
    ensure_topics(bootstrap, {inp: partitions}, topic_config=config)
    ensure_topics(bootstrap, {out: partitions, f"{inp}.dlq": 1, f"{inp}.late": 1})
    return inp, out


def drop_topics(bootstrap: str, inp: str, out: str) -> None:
    """Delete a run's topics: the embedded broker keeps every byte in memory until its
    topic is deleted (docs/BROKERS.md), and a broker holding earlier runs' gigabytes slowed
    later runs of one benchmark down (binary-request saturation 245k vs ~320k rows/s
    on a fresh broker)."""
    from consumers.admin import delete_topics

    delete_topics(bootstrap, [inp, out, f"{inp}.dlq", f"{inp}.late"])


def drain_throughput(res: Results) -> tuple[float, float]:
    """Requests/s and rows/s from the first to the last result of a backlog drain."""
    span = (res.result_ts_ms.max() - res.result_ts_ms.min()) / 1000.0
    n = len(res.docs)
    rows = sum(len(d["scores"]) for d in res.docs)
    return n / span, rows / span


def table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(out)
