"""Faust path vs the tidebatch worker, same machine, same load, same embedded broker:

- `tidebatch run --pipeline ctr --broker-profile embedded` (confluent-kafka, the default),
- the same worker with `--client kafka-python` (TIDEBATCH_CLIENT=kafka-python),
- the Faust example app (examples/faust_ctr: faust-streaming + aiokafka, adaptive_batches
  + BatchScorer), started with `faust -A examples.faust_ctr.app worker`.

Each gets a fresh topic pair (2 partitions) and the adaptive policy with the same SLO
and batch cap. Throughput: N CTR requests are preloaded, the consumer is started, and
the drain rate is counted from the first to the last result record (so start-up and
group join are excluded for all alike). Latency (optional): an open-loop Poisson load
at --rate req/s for --seconds, end to end (request timestamp -> result timestamp).

    .venv/bin/python bench/faust_vs_worker.py [--requests 4000] [--rate 300 --seconds 10]
                                              [--paths worker,kafka-python,faust] [--repeat 1]

Prints a table and writes out/bench/faust_vs_worker.json. Absolute numbers on this
2-core machine are noisy (other jobs share it); compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    OUT,
    REPO,
    RequestPool,
    drain_throughput,
    embedded_broker,
    fresh_topics,
    make_producer,
    open_loop,
    preload,
    produce_now,
    read_results,
    table,
    worker_process,
)
from consumers.brokers.embedded import free_port  # noqa: E402

PATHS = ("worker", "kafka-python", "faust")
LABELS = {
    "worker": "tidebatch run (confluent-kafka)",
    "kafka-python": "tidebatch run --client kafka-python",
    "faust": "Faust agent + adaptive_batches (aiokafka)",
}


@contextmanager
def faust_process(bootstrap: str, inp: str, out: str, log_name: str) -> Iterator[subprocess.Popen]:
    """The example Faust app; yields once it answered a probe request (joined, fetching)."""
    app_id = f"bench-faust-{uuid.uuid4().hex[:8]}"
    env = dict(
        os.environ,
        TIDEBATCH_FAUST_BROKER=f"kafka://{bootstrap}",
        TIDEBATCH_FAUST_BROKER_PROFILE="embedded",
        TIDEBATCH_FAUST_APP_ID=app_id,
        TIDEBATCH_FAUST_INPUT=inp,
        TIDEBATCH_FAUST_OUTPUT=out,
    )
    datadir = tempfile.mkdtemp(prefix="faust-data-")  # Faust's per-app state; nothing kept
    cmd = [
        sys.executable, "-m", "faust", "--datadir", datadir,
        "-A", "examples.faust_ctr.app", "worker", "-l", "info",
        "--web-port", str(free_port()), "--web-host", "127.0.0.1",
    ]
    log = OUT / f"{log_name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(datadir, ignore_errors=True)


@contextmanager
def consumer(path: str, bootstrap: str, inp: str, out: str, log_name: str) -> Iterator[subprocess.Popen]:
    if path == "faust":
        with faust_process(bootstrap, inp, out, log_name) as proc:
            yield proc
    else:
        extra = {"TIDEBATCH_CLIENT": "kafka-python"} if path == "kafka-python" else {}
        with worker_process(bootstrap, inp, out, "adaptive", extra_env=extra, log_name=log_name) as proc:
            yield proc


def wait_ready(bootstrap: str, inp: str, out: str, pool: RequestPool, proc: subprocess.Popen) -> None:
    """A probe request answered = the consumer joined and fetches (for latency runs)."""
    producer = make_producer(bootstrap, inp)
    run = f"probe-{uuid.uuid4().hex[:6]}"
    produce_now(producer, inp, *pool.get(0, run))
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"consumer exited with {proc.returncode}")
        if read_results(bootstrap, out, 1, timeout=1.0, run=run).docs:
            return
    raise RuntimeError("consumer never answered the probe")


def collect(bootstrap: str, out: str, n: int, run: str, proc: subprocess.Popen, timeout: float):
    """read_results, but give up as soon as the consumer process died."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        res = read_results(bootstrap, out, n, timeout=max(min(left, 20.0), 1.0), run=run)
        if len(res.docs) >= n or left <= 0:
            return res
        if proc.poll() is not None:
            raise RuntimeError(f"consumer exited with {proc.returncode} after {len(res.docs)}/{n} results")


def drain(path: str, bootstrap: str, pool: RequestPool, n: int, k: int) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-fvw-{path}")
    run = f"drain-{path}-{k}"
    preload(bootstrap, inp, pool, n, run)
    t0 = time.monotonic()
    with consumer(path, bootstrap, inp, out, f"fvw-drain-{path}-{k}") as proc:
        res = collect(bootstrap, out, n, run, proc, timeout=900)
    wall = time.monotonic() - t0
    req_s, rows_s = drain_throughput(res)
    return {
        "results": len(res.docs),
        "requests_per_s": req_s,
        "rows_per_s": rows_s,
        "mean_batch_rows": float(np.mean([d["batch_rows"] for d in res.docs])),
        "wall_s_including_startup": wall,
    }


def latency(path: str, bootstrap: str, pool: RequestPool, rate: float, seconds: float) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-fvw-lat-{path}")
    run = f"lat-{path}"
    with consumer(path, bootstrap, inp, out, f"fvw-lat-{path}") as proc:
        wait_ready(bootstrap, inp, out, pool, proc)
        sent = open_loop(bootstrap, inp, pool, rate, seconds, run)
        res = collect(bootstrap, out, sent, run, proc, timeout=120)
    p50, p99 = res.percentiles() if res.docs else (float("nan"), float("nan"))
    return {
        "rate": rate,
        "sent": sent,
        "results": len(res.docs),
        "p50_ms": p50,
        "p99_ms": p99,
        "mean_batch_rows": float(np.mean([d["batch_rows"] for d in res.docs])) if res.docs else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000, help="backlog size of each drain")
    ap.add_argument("--repeat", type=int, default=1, help="drains per path (the median is reported)")
    ap.add_argument("--rate", type=float, default=300.0, help="open-loop req/s for latency (0: skip)")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each latency run")
    ap.add_argument("--paths", default=",".join(PATHS))
    args = ap.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        ap.error(f"unknown paths {sorted(unknown)}; use {','.join(PATHS)}")

    import faust  # noqa: F401 -- fail early with a clear ImportError when the extra is missing

    OUT.mkdir(parents=True, exist_ok=True)
    pool = RequestPool()
    report: dict = {
        "machine": "2 cores, loopback, embedded broker (Tansu); policy adaptive, slo 100 ms, max 512 rows",
        "requests": args.requests,
        "mean_rows_per_request": pool.mean_rows,
        "drain": {},
        "latency": {},
    }
    with embedded_broker() as broker:
        bs = broker.bootstrap_servers
        runs: dict[str, list[dict]] = {p: [] for p in paths}
        # Interleaved rounds: the machine is shared, so each path sees the same drift.
        for k in range(args.repeat):
            for path in paths:
                r = drain(path, bs, pool, args.requests, k)
                runs[path].append(r)
                print(f"drain {path} (round {k + 1}): {r['requests_per_s']:.0f} req/s, {r['rows_per_s']:.0f} rows/s, "
                      f"mean batch {r['mean_batch_rows']:.0f} rows", flush=True)
        for path in paths:
            ordered = sorted(runs[path], key=lambda r: r["requests_per_s"])
            report["drain"][path] = {
                **ordered[len(ordered) // 2],
                "all_requests_per_s": [r["requests_per_s"] for r in runs[path]],
            }
        if args.rate > 0:
            for path in paths:
                report["latency"][path] = latency(path, bs, pool, args.rate, args.seconds)
                r = report["latency"][path]
                print(f"latency {path} @ {args.rate:.0f} req/s: p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms "
                      f"({r['results']}/{r['sent']})", flush=True)

    base = report["drain"].get("worker", {}).get("requests_per_s")
    rows = []
    for path in paths:
        d = report["drain"][path]
        lat = report["latency"].get(path, {})
        rows.append([
            LABELS[path],
            f"{d['requests_per_s']:.0f}",
            f"{d['rows_per_s']:.0f}",
            f"{d['requests_per_s'] / base:.2f}x" if base else "-",
            f"{d['mean_batch_rows']:.0f}",
            f"{lat['p50_ms']:.0f}" if lat else "-",
            f"{lat['p99_ms']:.0f}" if lat else "-",
        ])
    print()
    print(f"{args.requests} preloaded CTR requests ({pool.mean_rows:.1f} rows each on average), drained per path;"
          + (f" latency at {args.rate:.0f} req/s open loop for {args.seconds:.0f} s" if args.rate > 0 else ""))
    print(table(["path", "req/s", "rows/s", "vs worker", "mean batch rows", "p50 ms", "p99 ms"], rows))
    (OUT / "faust_vs_worker.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
