"""`tidebatch profile`'s broker-backed calibration: what each of the worker's threads
spends per request, Kafka work included, which the offline profile cannot time.

Why: timed offline, one stage at a time, the profile predicted about twice what a
backlog drain measured (docs/OWN_MODEL.md, "Profiling", "How close it comes"): the
worker's Python threads, sharing one GIL, limit it, and per request they spend more
than those stages: consuming, the producer's delivery reports and the produce calls,
the executors' queue and hand-over work, and what handing the GIL between three busy
threads costs each of them.

How: the pipeline's sample requests are produced to scratch topics at the broker, and
a real `Worker` (pipeline/worker/core.py, built by pipeline/app/compose.py
`build_parts` with the worker's own Kafka client config) drains them in this process
in the configuration given. Each thread's CPU clock is read by the thread the worker
actually runs (its source thread, and `Worker.threads()`: the executors and the
publisher, however many there are), between two points inside the drain, when both
the first requests (group join, first fetch, first calls) and the last are out of the
window. The rest of this process's CPU is librdkafka's own threads and ONNX Runtime's
pool; a broker on this machine, given its pids, and a model process are read from
/proc. pipeline/profiling/capacity.py puts the figures together.

    stage = calibrate(cfg, messages, bootstrap="127.0.0.1:9092", broker_profile="kafka")
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.config import WorkerConfig
from pipeline.errors import UserError

# The window measured: from this share of the requests having an outcome to this one.
WINDOW = (0.2, 0.9)
PARTITIONS = 2  # as bench/harness.py fresh_topics: what the drains of bench/profile_check.py read


@dataclass(frozen=True)
class ThreadCpu:
    """CPU seconds per request in a calibration, by where they were spent."""

    bootstrap: str
    requests: int  # requests in the measured window
    seconds: float  # its wall time
    source_s: float  # the source thread (consume, admission, delivery reports, commits)
    executors_s: float  # every executor thread together (collate, model in-process, split, queue)
    publisher_s: float  # the publisher thread (result documents, produce)
    other_s: float  # the rest of the process: librdkafka's threads, ONNX Runtime's pool
    model_process_s: float | None  # the model process (runtime.model_process), else None
    broker_s: float | None  # a broker on this machine, sharing its cores; None: not measured
    executors: int
    others_cores: float = 0.0  # cores the rest of the machine kept busy meanwhile (the prediction assumes none)
    drained_requests: int = 0  # all the worker drained: the measured window is WINDOW's share of them

    @property
    def drained(self) -> float:
        """Requests/s of the calibration's own drain (a cross-check, not the prediction)."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (0 once gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def descendants(pid: int) -> list[int]:
    """pid and every live process below it (one scan of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


class ProcessTree:
    """CPU seconds of a process, its live descendants and the children it has reaped:
    a `--processes N` worker's children and a model process are the worker's work too
    (process_cpu_seconds alone counts one process). The descendants are found again at
    most every `rescan_s` (a /proc scan costs milliseconds; CPU traces sample every 20 ms)."""

    def __init__(self, pid: int, rescan_s: float = 0.5) -> None:
        self.pid, self.rescan_s = pid, rescan_s
        self._pids: list[int] = []
        self._scanned = float("-inf")

    def cpu_seconds(self) -> float:
        now = time.monotonic()
        if now - self._scanned >= self.rescan_s:
            self._pids, self._scanned = descendants(self.pid), now
        # A descendant that exited between scans reads 0 until the next one; once
        # reaped by this process its time is in cutime below (one reaped by another
        # descendant shows when that one is reaped: small, and only at exits).
        total = sum(process_cpu_seconds(p) for p in self._pids)
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return total
        return total + (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # reaped: cutime, cstime


def machine_cpu_seconds() -> tuple[float, float]:
    """CPU seconds of the whole machine so far, every core (/proc/stat): busy (user,
    nice, system, irq, softirq; guest is inside user) and stolen by the hypervisor."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]] + [0] * 8
    hz = os.sysconf("SC_CLK_TCK")
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / hz, f[7] / hz


def thread_cpu_seconds(ident: int) -> float:
    """CPU seconds of one thread of this process so far (ns resolution)."""
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


@dataclass(frozen=True)
class Reading:
    """One look at the clocks during a drain."""

    outcomes: int
    wall: float
    threads: Mapping[str, float]  # "source", "publisher", "executor-<i>" -> CPU seconds
    process: float
    model_process: float | None
    broker: float | None
    machine: float = 0.0  # busy CPU seconds of the whole machine


def per_request(a: Reading, b: Reading, bootstrap: str) -> ThreadCpu:
    """The figures between two readings (pure: the unit tests hand it fakes)."""
    n = b.outcomes - a.outcomes
    if n <= 0:
        raise UserError("profile calibration: no request finished in the measured window")
    spent = {name: (b.threads[name] - a.threads.get(name, 0.0)) / n for name in b.threads}
    executors = [k for k in spent if k.startswith("executor")]
    python = sum(spent.values())

    def delta(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else (y - x) / n

    ours = (b.process - a.process) + sum(x for x in (b.model_process, b.broker) if x is not None) - sum(
        x for x in (a.model_process, a.broker) if x is not None)
    wall = b.wall - a.wall
    return ThreadCpu(
        bootstrap=bootstrap, requests=n, seconds=wall,
        source_s=spent.get("source", 0.0), executors_s=sum(spent[k] for k in executors),
        publisher_s=spent.get("publisher", 0.0),
        other_s=max((b.process - a.process) / n - python, 0.0),
        model_process_s=delta(a.model_process, b.model_process), broker_s=delta(a.broker, b.broker),
        executors=len(executors),
        others_cores=max((b.machine - a.machine) - ours, 0.0) / wall if wall > 0 else 0.0,
    )


def _preload(cfg: WorkerConfig, topic: str, messages: Sequence[tuple[bytes | None, bytes | None, dict]]) -> None:
    from pipeline.kafka_backend import make_producer

    producer = make_producer(cfg)
    failed: list[object] = []
    for key, value, headers in messages:
        producer.send(topic, key, value, list(headers.items()) or None,
                      lambda err: failed.append(err) if err is not None else None)
        producer.poll(0)
    if producer.flush(60.0) or failed:
        raise UserError(f"profile calibration: could not produce its requests to {topic}: {failed[:1] or 'timed out'}")


def calibrate(
    cfg: WorkerConfig,
    messages: Sequence[tuple[bytes | None, bytes | None, dict]],
    *,
    bootstrap: str,
    broker_profile: str,
    broker_pids: Sequence[int] = (),
    timeout_s: float = 300.0,
    progress: Callable[[str], None] = lambda line: None,
) -> ThreadCpu:
    """Drain `messages` (the pipeline's sample requests: key, value, headers) through a
    worker of configuration `cfg` on scratch topics at `bootstrap`, deleted afterwards.
    `broker_pids`: the broker's processes when it runs on this machine."""
    from consumers.admin import delete_topics, ensure_topics

    tag = f"tidebatch-profile-{uuid.uuid4().hex[:8]}"
    inp, out = f"{tag}.requests", f"{tag}.results"
    kcfg = replace(cfg, bootstrap_servers=bootstrap, broker_profile=broker_profile, input_topic=inp,
                   output_topic=out, dlq_topic=None, late_topic=None, group_id=tag, create_topics=False)
    names = [inp, out, f"{inp}.dlq", f"{inp}.late"]
    admin = kcfg.kafka.client("admin")
    ensure_topics(bootstrap, {inp: PARTITIONS, out: PARTITIONS, f"{inp}.dlq": 1, f"{inp}.late": 1}, admin_config=admin)
    try:
        _preload(kcfg, inp, messages)
        progress(f"calibration: {len(messages)} requests preloaded; a worker drains them")
        return _drain(kcfg, len(messages), bootstrap, broker_pids, timeout_s)
    finally:
        delete_topics(bootstrap, names, admin_config=admin)


def _drain(cfg: WorkerConfig, count: int, bootstrap: str, broker_pids: Sequence[int], timeout_s: float) -> ThreadCpu:
    from pipeline.app.compose import build_parts
    from pipeline.runtime.model_process import ProcessSession
    from pipeline.worker.core import Worker

    parts = build_parts(cfg)
    worker = Worker(cfg, parts=parts)
    exit_code: list[int] = []
    source = threading.Thread(target=lambda: exit_code.append(worker.run()), name="calibration-source", daemon=True)
    source.start()

    def outcomes() -> int:
        s = worker.stats
        return s.scored + s.routed_late + s.dlq + s.undeliverable + s.duplicates

    def reading() -> Reading:
        # The threads the worker runs, by their names (pipeline/worker/executors.py, publisher.py).
        idents = {"source": source.ident, **{t.name: t.ident for t in worker.threads()}}
        session = worker.session
        return Reading(
            outcomes(), time.monotonic(), {k: thread_cpu_seconds(v) for k, v in idents.items() if v is not None},
            time.process_time(),
            process_cpu_seconds(session.pid) if isinstance(session, ProcessSession) else None,
            sum(process_cpu_seconds(p) for p in broker_pids) if broker_pids else None,
            machine_cpu_seconds()[0],
        )

    deadline = time.monotonic() + timeout_s
    try:
        marks = [int(count * share) for share in WINDOW]
        taken: list[Reading] = []
        # Every request has its outcome before the worker stops, so that its own log
        # (consumed=...) counts all that were preloaded, not what it had taken when the
        # window closed (issue 48: "20,000 preloaded", worker "consumed=19000").
        for mark in (*marks, count):
            while outcomes() < mark:
                if exit_code or worker.failure:
                    raise UserError(f"profile calibration: the worker stopped: {worker.failure or 'exit'}")
                if time.monotonic() > deadline:
                    raise UserError(f"profile calibration: {outcomes()} of {count} requests done at {bootstrap} "
                                    f"in {timeout_s:.0f} s")
                time.sleep(0.02)
            if len(taken) < len(marks):
                taken.append(reading())
        return replace(per_request(taken[0], taken[1], bootstrap), drained_requests=count)
    finally:
        worker.stop("calibration done")
        source.join(timeout=60)
        parts.close()
