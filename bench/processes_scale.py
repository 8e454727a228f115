"""Issue 46's scale-out figure, three ways side by side at each N in one run:

- `processes`: one `tidebatch run --processes N` (N workers in one group sharing one
  model host, pipeline/app/ and pipeline/runtime/shared_host.py),
- `workers`: N independent `tidebatch run` processes in one group (each its own model,
  its own ops port: what a user could do before `--processes`),
- `passthrough`: N members of a plain consume-and-produce group, no decode, no model
  (bench/passthrough_member.py): the ceiling the broker and the clients allow at N.

Each case gets fresh topics (`--partitions`, default max(16, 2 x the largest N)), starts
its processes, waits until the group holds every partition, and only then produces the
backlog from `--producers` processes with every value encoded beforehand (a group that
settles while it drains would measure the rebalance). Rows/s run from the first to the
last output record's timestamp; CPU (cores) of the case's processes and their children,
the broker and the producers over the drain is measured from /proc: on a small machine
they share the cores, and the producers' share is part of the figure. When the backlog
took as long to produce as to drain, the row says "generator-bound".

    .venv/bin/python bench/processes_scale.py [--broker tansu|kafka] [--processes 1,2]
        [--cases processes,workers,passthrough] [--requests 20000] [--encoding binary|json]
        [--pipeline ctr|camera] [--provider cpu|cuda|auto] [--producers 1] [--repeat 1]

One JSON (out/bench/processes_scale.json) and a table. On a GPU host:
`--processes 1,2,4,8,12 --provider cuda --requests 200000 --producers 4` (docs/OPERATIONS.md,
"Many processes on one host"); `--pipeline camera` gives frames/s per N.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    BROKERS,
    OUT,
    REPO,
    RequestPool,
    drop_topics,
    fresh_topics,
    local_broker,
    make_producer,
    produce_now,
    profile_of,
    stop_process,
    table,
    worker_command,
)
from consumers.brokers.embedded import free_port  # noqa: E402
from consumers.profiles import consumer_config  # noqa: E402
from pipeline.profiling.calibration import ProcessTree, process_cpu_seconds  # noqa: E402

CASES = ("processes", "workers", "passthrough")
# A drain's backlog is older than any SLO.
DRAIN_ENV = {"TIDEBATCH_BATCHING__SLO_MS": "3600000", "TIDEBATCH_BATCHING__MAX_QUEUE_DELAY_MS": "10",
             "TIDEBATCH_CREATE_TOPICS": "false"}
# CTR: 1024-row batches as bench/pipeline_capacity.py. Never for camera: 1024 frames of
# 640x480 are a 3.8 GB CenterFace input and tens of GB of activations (the worker was
# OOM-killed); its pipeline's own batch cap stays.
CTR_ENV = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "1024"}
_VALUES: list[tuple[bytes | None, bytes, list[tuple[str, bytes]] | None]] = []  # forked into the producers


def backlog(pipeline: str, encoding: str, n: int, run: str) -> tuple[list, int]:
    """n encoded requests (key, value, headers) and their rows (frames for camera)."""
    if pipeline == "camera":
        from pipeline.loadgen.camera import CameraFrameFactory

        gen = CameraFrameFactory(seed=5, cameras=16, resolutions=((640, 480),))
        frames = [gen.make(i % 16, i // 16, i / 30.0) for i in range(min(n, 256))]
        values = []
        for i in range(n):
            key, value, headers = frames[i % len(frames)]
            headers = [(k, f"{run}-{i}".encode() if k == "frame_id" else v) for k, v in headers]
            values.append((key, value, headers))
        return values, n
    pool = RequestPool(encoding=encoding)
    return [(*pool.get(i, run), None) for i in range(n)], int(sum(pool.rows[i % len(pool.rows)] for i in range(n)))


def _produce_slice(args: tuple[str, str, int, int]) -> tuple[float, float, float]:
    """A producer process's share of the backlog: (cpu s, first, last produce time)."""
    bootstrap, topic, lo, hi = args
    producer = make_producer(bootstrap, topic, {"linger.ms": 5})
    t0 = time.time()
    for key, value, headers in _VALUES[lo:hi]:
        produce_now(producer, topic, key, value, headers)
    assert producer.flush(120) == 0
    return time.process_time(), t0, time.time()


def produce_backlog(bootstrap: str, topic: str, producers: int) -> dict[str, float]:
    n = len(_VALUES)
    cuts = np.linspace(0, n, producers + 1).astype(int)
    with multiprocessing.get_context("fork").Pool(producers) as pool:
        got = pool.map(_produce_slice, [(bootstrap, topic, int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)])
    return {"cpu_s": sum(g[0] for g in got), "start": min(g[1] for g in got), "end": max(g[2] for g in got)}


class Case:
    """The processes of one case and how to tell that they settled and finished."""

    def __init__(self, kind: str, n: int, bootstrap: str, inp: str, out: str, pipeline: str, env: dict[str, str],
                 tag: str) -> None:
        self.kind, self.n, self.procs, self.ports, self.ready_files = kind, n, [], [], []
        self._dir = Path(tempfile.mkdtemp(prefix="scale-"))
        group = f"scale-{kind}-{n}-{uuid.uuid4().hex[:6]}"
        base_env = {**os.environ, "PYTHONPATH": str(REPO), **DRAIN_ENV, **env}
        for i in range(1 if kind == "processes" else n):
            log = open(OUT / f"scale-{tag}-{kind}{n}-{i}.log", "wb")  # noqa: SIM115 (closed with the process)
            if kind == "passthrough":
                ready = self._dir / f"ready-{i}"
                self.ready_files.append(ready)
                cmd = [sys.executable, str(REPO / "bench" / "passthrough_member.py"), "--bootstrap", bootstrap,
                       "--profile", profile_of(bootstrap), "--input", inp, "--output", out, "--group", group,
                       "--ready", str(ready)]
                proc_env = base_env
            else:
                port = free_port()
                self.ports.append(port)
                cmd = worker_command(bootstrap, inp, out, "static", group, pipeline)
                proc_env = {**base_env, "TIDEBATCH_METRICS__PORT": str(port),
                            "TIDEBATCH_RUNTIME__PROCESSES": str(n if kind == "processes" else 1)}
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=proc_env, cwd=REPO))
        self.trees = [ProcessTree(p.pid) for p in self.procs]

    def _metric(self, name: str) -> float:
        from pipeline.app.demo import _sum, scrape

        total = 0.0
        for port in self.ports:
            with suppress(OSError):
                total += _sum(scrape(f"http://127.0.0.1:{port}/metrics"), name)
        return total

    def holdings(self) -> list[int]:
        """Partitions held by each member (each child of a `--processes` host)."""
        if self.kind == "passthrough":
            return [int(f.read_text() or 0) if f.exists() else 0 for f in self.ready_files]
        from pipeline.app.demo import scrape_text
        from pipeline.ops.stats import from_text

        held: list[int] = []
        for port in self.ports:
            try:
                series = from_text(scrape_text(f"http://127.0.0.1:{port}/metrics"))
            except OSError:
                return []
            held += [int(v) for v in series.get("tidebatch_assigned_partitions", {}).values()]
        return held

    def settled(self, partitions: int) -> bool:
        """Every member holds partitions and all are held: the last join is over (the
        first member holds everything until the others join)."""
        held = self.holdings()
        return len(held) == self.n and min(held) > 0 and sum(held) == partitions

    def outcomes(self) -> float:
        return self._metric("tidebatch_records_total")

    def check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{self.kind} x{self.n}: a process exited with {p.returncode}; see out/bench/scale-*")

    def cpu_seconds(self) -> float:
        return sum(t.cpu_seconds() for t in self.trees)

    def stop(self) -> None:
        for p in self.procs:
            stop_process(p, 60.0)


def wait_until(test: Any, case: Case, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        case.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{case.kind} x{case.n}: {what} not reached in {timeout:.0f} s")
        time.sleep(0.2)


def output_times(bootstrap: str, topic: str, expect: int, timeout: float) -> np.ndarray:
    """Timestamps (ms) of the output topic's records, read until `expect` came."""
    from consumers.admin import existing_topics

    consumer = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"scale-read-{uuid.uuid4().hex[:6]}"))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(existing_topics(bootstrap)[topic])])
    stamps: list[int] = []
    deadline = time.monotonic() + timeout
    try:
        while len(stamps) < expect and time.monotonic() < deadline:
            stamps += [m.timestamp()[1] for m in consumer.consume(5000, timeout=0.2) if not m.error()]
    finally:
        consumer.close()
    return np.array(stamps, dtype=float)


def measure(kind: str, n: int, bootstrap: str, broker_pids: list[int], args: argparse.Namespace, rows: int,
            tag: str) -> dict[str, Any]:
    inp, out = fresh_topics(bootstrap, f"scale-{kind}{n}", partitions=args.partitions)
    env = {"TIDEBATCH_RUNTIME__PROVIDERS": args.provider, **(CTR_ENV if args.pipeline == "ctr" else {})}
    case = Case(kind, n, bootstrap, inp, out, args.pipeline, env, tag)
    try:
        wait_until(lambda: case.settled(args.partitions), case, 180, "every member holding partitions")
        time.sleep(3.0)  # a join still under way (Kafka's initial rebalance delay is 3 s)
        wait_until(lambda: case.settled(args.partitions), case, 60, "every member holding partitions")
        total = len(_VALUES)
        wall0, cpu0 = time.monotonic(), case.cpu_seconds()
        broker0 = sum(process_cpu_seconds(p) for p in broker_pids)
        bench0 = time.process_time()
        made = produce_backlog(bootstrap, inp, args.producers)
        if kind == "passthrough":
            stamps = output_times(bootstrap, out, total, timeout=600)
            reader = "the bench's reader, during the drain"
        else:
            wait_until(lambda: case.outcomes() >= total, case, 900, f"{total} outcomes")
            reader = "after the drain"
        wall = time.monotonic() - wall0
        cores = {"case": (case.cpu_seconds() - cpu0) / wall,
                 "broker": (sum(process_cpu_seconds(p) for p in broker_pids) - broker0) / wall,
                 "producers": made["cpu_s"] / wall, "bench": (time.process_time() - bench0) / wall}
        if kind != "passthrough":
            stamps = output_times(bootstrap, out, total, timeout=300)
    finally:
        case.stop()
        drop_topics(bootstrap, inp, out)
    span = float(stamps.max() - stamps.min()) / 1000.0 if len(stamps) > 1 else float("nan")
    produce_s = made["end"] - made["start"]
    return {"case": kind, "n": n, "records": len(stamps), "rows_per_s": rows * len(stamps) / total / span,
            "records_per_s": len(stamps) / span, "drain_s": span, "produce_s": produce_s,
            "generator_bound": produce_s >= 0.8 * span, "cores": cores, "read": reader}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=BROKERS, default="tansu")
    ap.add_argument("--processes", default="1,2", help="the Ns, comma-separated")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--encoding", choices=("binary", "json"), default="binary")
    ap.add_argument("--pipeline", choices=("ctr", "camera"), default="ctr")
    ap.add_argument("--provider", default="auto")
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=0, help="default max(16, 2 x the largest N)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT / "processes_scale.json")
    args = ap.parse_args()
    ns = [int(x) for x in args.processes.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    if bad := [c for c in cases if c not in CASES]:
        ap.error(f"unknown case {bad[0]!r}; use {', '.join(CASES)}")
    args.partitions = args.partitions or max(16, 2 * max(ns))
    OUT.mkdir(parents=True, exist_ok=True)
    run = f"s{uuid.uuid4().hex[:6]}"
    values, rows = backlog(args.pipeline, args.encoding, args.requests, run)
    _VALUES[:] = values
    results: list[dict[str, Any]] = []
    with ExitStack() as stack:
        broker = stack.enter_context(local_broker(args.broker))
        from bench.harness import _BROKER_PIDS

        pids = _BROKER_PIDS.get(broker.bootstrap_servers, [])
        for rep in range(args.repeat):
            for n in ns:
                for kind in cases:  # the cases take turns at each N: drift spreads over all
                    try:
                        row = measure(kind, n, broker.bootstrap_servers, pids, args, rows, f"{rep}")
                    except RuntimeError as exc:
                        row = {"case": kind, "n": n, "failed": str(exc)}
                    row["repeat"] = rep
                    results.append(row)
                    print(json.dumps(row), flush=True)
    report = {"broker": args.broker, "pipeline": args.pipeline, "encoding": args.encoding, "requests": args.requests,
              "provider": args.provider, "producers": args.producers, "partitions": args.partitions,
              "cpus": len(os.sched_getaffinity(0)), "results": results}
    args.out.write_text(json.dumps(report, indent=2))
    print(table(["case", "N", "rows/s", "drain s", "produce s", "cores case/broker/producers"], [
        [r["case"], r["n"], f"{r['rows_per_s']:,.0f}" if "rows_per_s" in r else r.get("failed", "?"),
         f"{r.get('drain_s', float('nan')):.2f}", f"{r.get('produce_s', float('nan')):.2f}"
         + (" generator-bound" if r.get("generator_bound") else ""),
         "/".join(f"{r['cores'][k]:.2f}" for k in ("case", "broker", "producers")) if "cores" in r else ""]
        for r in results]))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
