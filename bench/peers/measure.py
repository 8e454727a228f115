"""One measurement of one peer (bench/peers/launch.py) on a fresh topic pair:
a backlog drain or a paced live load, each read back from the output topic and
checked against the model's own scores.

CPU is read from /proc (bench/harness.py, cpu_seconds) for the peer's process and the
broker's processes separately, sampled every 20 ms by a thread of its own, and taken
between the first and the last result's timestamp: start-up (imports, model load,
group join) is outside the window for every peer alike, and so is the idle tail.
(It was read when the reader saw new results: a reader that fell behind a fast peer
read most results after the peer had finished, and tidebatch's drains came out at
1.4 CPU-seconds per 10k requests where its process had used ~4; commit 8e56001.)
A drain's trace starts when the peer's process does: tidebatch's rows are handed over
only once they have partitions and a second more (bench/harness.py, worker_process),
and by then they had scored part of the backlog; a trace started there read that part
as free (the window's start clamped to the trace's first sample): 0.4-1.5 CPU-seconds
per 10k requests where the loops read 2-4. `cpu_between` now refuses a window the
trace does not cover.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.harness import (
    RequestPool,
    cpu_seconds,
    cpu_shares,
    drop_topics,
    fresh_topics,
    make_producer,
    preload,
    produce_now,
    profile_of,
)
from bench.peers.launch import Peer, peer_process
from consumers.profiles import consumer_config
from pipeline.loadgen.pacing import poisson_schedule, run_open_loop
from pipeline.profiling.calibration import ProcessTree

PARTITIONS = 4
SLO_MS = 100.0


@dataclass
class Collected:
    """What came back for one run: first result per request id, and the CPU window."""

    docs: dict[str, dict] = field(default_factory=dict)
    result_ts: dict[str, int] = field(default_factory=dict)
    records: int = 0  # every result record of the run, duplicates included
    trace: list[tuple[float, float, float]] = field(default_factory=list)  # (wall ms, peer cpu s, broker cpu s)

    def cpu_between(self, t0_ms: float, t1_ms: float) -> tuple[float, float]:
        """CPU seconds of the peer and of the broker between two wall-clock times, which
        the trace must cover (np.interp would clamp a time outside it to its ends)."""
        t, peer, broker = (np.array(col, dtype=float) for col in zip(*self.trace, strict=True))
        if not t[0] <= t0_ms <= t1_ms <= t[-1]:
            raise ValueError(f"CPU window {t0_ms:.0f}-{t1_ms:.0f} ms is outside the trace's {t[0]:.0f}-{t[-1]:.0f} ms")
        return (float(np.interp(t1_ms, t, peer) - np.interp(t0_ms, t, peer)),
                float(np.interp(t1_ms, t, broker) - np.interp(t0_ms, t, broker)))


class CpuTrace:
    """Samples the peer's and the broker's CPU every `every` s into `out` until stopped."""

    def __init__(self, out: list[tuple[float, float, float]], pid: int, broker_pids: list[int],
                 every: float = 0.02) -> None:
        self.out, self.pid, self.broker_pids, self.every = out, pid, broker_pids, every
        self._tree = ProcessTree(pid)  # a --processes N row's children are the peer too
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-trace", daemon=True)

    def _sample(self) -> None:
        self.out.append((time.time() * 1000.0, self._tree.cpu_seconds(), sum(cpu_seconds(p) for p in self.broker_pids)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)

    def __enter__(self) -> CpuTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def collect(bootstrap: str, topic: str, run: str, expect: int, proc: subprocess.Popen, broker_pids: list[int],
            timeout: float, idle_timeout: float | None = None, into: Collected | None = None) -> Collected:
    """Read `topic` until `expect` distinct results of `run` came back, the peer died,
    `timeout` passed, or (idle_timeout) nothing new came for that long. into: results
    whose CPU trace the caller runs (a drain's starts with the peer's process); else
    one is traced while reading."""
    consumer = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"peers-reader-{uuid.uuid4().hex[:8]}"))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got = into if into is not None else Collected()
    prefix = run + "-"
    deadline = time.monotonic() + timeout
    try:
        with contextlib.nullcontext() if into is not None else CpuTrace(got.trace, proc.pid, broker_pids):
            _read(consumer, got, prefix, expect, deadline, proc, idle_timeout)
    finally:
        consumer.close()
    return got


def _read(consumer: Consumer, got: Collected, prefix: str, expect: int, deadline: float, proc: subprocess.Popen,
          idle_timeout: float | None) -> None:
    """Results of `prefix` into `got` until `expect` came back, the peer died, the
    deadline passed, or (idle_timeout) nothing new came for that long."""
    last_new = time.monotonic()
    while len(got.docs) < expect and time.monotonic() < deadline and proc.poll() is None:
        if idle_timeout is not None and time.monotonic() - last_new > idle_timeout:
            break
        new = 0
        for m in consumer.consume(num_messages=2000, timeout=0.1):
            if m.error() or not m.value():
                continue
            doc = orjson.loads(m.value())
            rid = doc.get("request_id", "")
            if not rid.startswith(prefix):
                continue
            got.records += 1
            if rid not in got.docs:
                got.docs[rid], got.result_ts[rid] = doc, m.timestamp()[1]
                new += 1
        if new:
            last_new = time.monotonic()
    # Duplicates come after a rebalance or a restart: a short look for late ones.
    if len(got.docs) >= expect:
        for m in consumer.consume(num_messages=2000, timeout=0.5):
            if not m.error() and m.value() and orjson.loads(m.value()).get("request_id", "").startswith(prefix):
                got.records += 1


def reference_scores(pool: RequestPool) -> list[list[float]]:
    """The model's own scores of every request template, one request per call."""
    from bench.peers.common import Scorer

    scorer = Scorer(1)
    out = []
    for i in range(len(pool.templates)):
        (doc,) = scorer.score([(pool.get(i, "ref")[1], 0)])
        out.append(orjson.loads(doc)["scores"])
    return out


def correctness(got: Collected, pool: RequestPool, reference: list[list[float]], sent: int) -> dict:
    """Every request scored, its scores against the model's own (reference: per
    request template, scored directly by bench/peers.py), and the duplicates: every
    row delivers at least once, so a rebalance on a busy machine may repeat a few."""
    worst = 0.0
    for rid, doc in got.docs.items():
        ref = reference[int(rid.rsplit("-", 1)[1]) % len(reference)]
        scores = doc.get("scores") or []
        if len(scores) != len(ref):
            worst = float("inf")
            break
        worst = max(worst, float(np.max(np.abs(np.asarray(scores) - np.asarray(ref)))))
    return {"sent": sent, "scored": len(got.docs), "duplicates": got.records - len(got.docs),
            "max_abs_diff": worst, "correct": len(got.docs) == sent and worst <= 1e-6}


def drain(peer: Peer, bootstrap: str, pool: RequestPool, n: int, reference: list[list[float]],
          broker_pids: list[int], tag: str) -> dict:
    """Preload n requests, start the peer, read until all n are scored."""
    inp, out = fresh_topics(bootstrap, f"peers-{peer.name}", partitions=PARTITIONS)
    run = f"d{uuid.uuid4().hex[:6]}"
    preload(bootstrap, inp, pool, n, run)
    got = Collected()
    traces: list[CpuTrace] = []

    def trace_from_spawn(proc: subprocess.Popen) -> None:
        traces.append(CpuTrace(got.trace, proc.pid, broker_pids).__enter__())

    def stop_traces() -> None:  # before the peer is stopped: a gone process reads 0 CPU
        while traces:
            traces.pop().__exit__(None, None, None)

    try:
        with peer_process(peer, bootstrap, inp, out, drain=True, log_name=f"peers-{peer.name}-{tag}",
                          on_spawn=trace_from_spawn) as proc:
            try:
                # A row that drops requests (quix-window: late for its window) stops after 30 s
                # without a new result instead of waiting the whole timeout.
                collect(bootstrap, out, run, n, proc, broker_pids, timeout=max(240.0, n / 50), idle_timeout=30,
                        into=got)
            finally:
                stop_traces()
    finally:
        stop_traces()
        drop_topics(bootstrap, inp, out)
    result = correctness(got, pool, reference, n)
    if not got.docs:  # results that all came in the reader's first read are a success
        return {**result, "failed": f"0/{n} scored; exit code {proc.poll()}; see {proc.log_path}"}  # type: ignore[attr-defined]
    ts = np.array(list(got.result_ts.values()), dtype=float)
    span = (ts.max() - ts.min()) / 1000.0 if len(ts) > 1 else float("nan")
    rows = sum(len(d.get("scores", [])) for d in got.docs.values())
    # The requests answered after the first result, in the CPU spent from it to the last.
    worker_s, broker_s = got.cpu_between(ts.min(), ts.max())
    per10k = 10_000 / (len(ts) - 1) if len(ts) > min(1000, n // 2) else float("nan")  # a --quick run: no figure
    return {**result, "requests_per_s": len(got.docs) / span, "rows_per_s": rows / span,
            "mean_batch_rows": float(np.mean([d.get("batch_rows", 0) for d in got.docs.values()])),
            "worker_cpu_s_per_10k": worker_s * per10k, "broker_cpu_s_per_10k": broker_s * per10k}


def wait_ready(bootstrap: str, inp: str, out: str, pool: RequestPool, proc: subprocess.Popen,
               broker_pids: list[int]) -> None:
    """A probe request answered = the peer joined and fetches."""
    producer = make_producer(bootstrap, inp)
    run = f"probe{uuid.uuid4().hex[:6]}"
    produce_now(producer, inp, *pool.get(0, run))
    assert producer.flush(30) == 0
    got = collect(bootstrap, out, run, 1, proc, broker_pids, timeout=180)
    if not got.docs:
        raise RuntimeError(f"peer never answered the probe (exit code {proc.poll()}); see {proc.log_path}")  # type: ignore[attr-defined]


def send_schedule(bootstrap: str, topic: str, pool: RequestPool, times: list[float], run: str) -> int:
    """Request i at `times[i]` s from now, open loop, every value encoded before the
    clock starts (bench/harness.py's open_loop encodes each as it sends it)."""
    values = [pool.get(i, run) for i in range(len(times))]
    producer = make_producer(bootstrap, topic)

    def send(i: int) -> None:
        produce_now(producer, topic, *values[i])
        producer.poll(0)

    sent, _ = run_open_loop(iter(times), send, idle=lambda s: producer.poll(s))
    assert producer.flush(60) == 0
    return sent


@dataclass
class Scheduled:
    """One scheduled load's outcome: the results, how many were sent, the cores used
    while sending (bench/harness.py cpu_shares) and the wall clock (ms) it started at."""

    got: Collected
    sent: int
    cores: dict[str, float]
    t0_ms: float


def scheduled_run(peer: Peer, bootstrap: str, pool: RequestPool, times: list[float], broker_pids: list[int],
                  log_name: str, timeout: float, idle_timeout: float) -> Scheduled:
    """A fresh topic pair, the peer started and answering a probe, then the requests
    sent at `times` and read back (until `timeout` s, or `idle_timeout` s with nothing new)."""
    inp, out = fresh_topics(bootstrap, log_name, partitions=PARTITIONS)
    run = f"l{uuid.uuid4().hex[:6]}"
    try:
        with peer_process(peer, bootstrap, inp, out, drain=False, log_name=log_name) as proc:
            wait_ready(bootstrap, inp, out, pool, proc, broker_pids)
            with cpu_shares(bootstrap, proc.pid, machine=True) as cores:
                t0_ms = time.time() * 1000.0
                sent = send_schedule(bootstrap, inp, pool, times, run)
            got = collect(bootstrap, out, run, sent, proc, broker_pids, timeout=timeout, idle_timeout=idle_timeout)
    finally:
        drop_topics(bootstrap, inp, out)
    return Scheduled(got, sent, cores, t0_ms)


def live(peer: Peer, bootstrap: str, pool: RequestPool, rate: float, seconds: float,
         reference: list[list[float]], broker_pids: list[int], tag: str) -> dict:
    """p50/p99 end to end (request timestamp → result timestamp) and SLO goodput at a
    paced load (Poisson arrivals at `rate` req/s for `seconds`); requests not answered
    within 20 s of the load's end count as never answered (infinitely late)."""
    times = [t for t in poisson_schedule(rate, int(rate * seconds * 1.2) + 10, 3) if t < seconds]
    done = scheduled_run(peer, bootstrap, pool, times, broker_pids, f"peers-live-{peer.name}-{tag}",
                         timeout=20, idle_timeout=5)
    got, sent, cores = done.got, done.sent, done.cores
    lat = np.array([got.result_ts[r] - d["kafka_ts_ms"] for r, d in got.docs.items()], dtype=float)
    lat = np.concatenate([lat, np.full(sent - len(lat), np.inf)])
    result = correctness(got, pool, reference, sent)
    return {**result, "rate_req_s": rate, "seconds": seconds, "cpu_cores": cores,
            "p50_ms": float(np.percentile(lat, 50, method="higher")),
            "p99_ms": float(np.percentile(lat, 99, method="higher")),
            "goodput_req_s": float((lat <= SLO_MS).sum()) / seconds, "in_slo": float((lat <= SLO_MS).mean())}
