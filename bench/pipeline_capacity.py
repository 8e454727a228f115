"""Issue 2's measurement, in one run on this machine:

- the CTR model's own peak: direct ONNX Runtime, 1 intra-op thread (the worker's
  setting), best batch size, on the rows of the requests this bench sends, every call
  on rows it has not just seen (bench/model_peak.py says why). Measured at the start
  and at the end of the run; the higher figure is the denominator of every ratio.
- the raw Kafka passthrough ceiling (consume + produce the same records, no decoding,
  no inference),
- the pipeline's saturation throughput (a preloaded backlog drained by a `tidebatch
  run` process) per policy, and p50/p99 end-to-end latency at 50 % of the static
  policy's saturation rate,
- the saturation throughput again with the same requests in the binary form
  (pipeline/codecs/ctr_binary.py; --binary-policies, default none and static),
- static saturation (JSON and binary) and adaptive latency again with ONNX Runtime in
  a model process of its own (runtime.model_process, pipeline/runtime/model_process.py),
  unpinned and with pinned cores (runtime.pin_executors: the model process on one core,
  the worker's threads on the other; for workers that own their cores).

    .venv/bin/python bench/pipeline_capacity.py [--broker kafka|tansu|both] [--requests 20000]
        [--latency-seconds 15] [--repeat 1] [--soak 0] [--policies static,...]
        [--binary-policies none,static] [--no-model-process]

--broker picks the broker (bench/harness.py): Apache Kafka, one local node, the default;
the embedded Tansu broker; or both, one after the other in the same run, with a table
of the two side by side at the end. Every measurement gets a broker of its own.

With --repeat N every saturation case is drained N times, the cases taking turns
(so that the machine's drift spreads over all of them), and the table gives the
median with the range. Prints a table and writes out/bench/pipeline_capacity.json.
With --soak S it also runs the static policy at 50 % load for S seconds and samples
the worker's RSS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    BROKERS,
    OUT,
    RequestPool,
    cpu_shares,
    cpu_text,
    drain_throughput,
    drop_topics,
    fresh_topics,
    local_broker,
    make_producer,
    open_loop,
    preload,
    produce_now,
    profile_of,
    read_results,
    stages,
    stages_text,
    table,
    wait_outcomes,
    worker_process,
)

POLICIES = ("none", "static", "greedy", "adaptive")
# 1024 rows: the model's own rows/s is flat from 128 to 1024 rows (model_peak below),
# and twice the rows per batch halves the worker's per-batch work (hand-overs, GIL
# waits). With 512 rows the binary-request drain ran ~10 % slower.
STATIC_ENV = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "1024", "TIDEBATCH_BATCHING__MAX_QUEUE_DELAY_MS": "10"}


def fresh(engine: str, measure: Callable[..., dict], *args: Any) -> dict:
    """One measurement on a broker of its own: the embedded broker slows down with what
    it has served (docs/BROKERS.md), and a later row of one run must not pay for earlier
    ones (the same binary-request drain ran ~10 % slower as the eighth run on a Tansu
    broker than on a fresh one). Apache Kafka gets the same treatment, for equal terms."""
    with local_broker(engine) as broker:
        return measure(broker.bootstrap_servers, *args)


def model_peak() -> dict:
    from bench.model_peak import measure

    return measure("ctr", [32, 128, 256, 512, 1024, 2048], threads=1, provider="cpu", seconds=1.0, feeds="requests")


def passthrough(bootstrap: str, pool: RequestPool, n: int) -> dict:
    """consume + produce, no decode, no inference: the Kafka ceiling of one process."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from consumers.profiles import consumer_config

    inp, out = fresh_topics(bootstrap, "bench-pass")
    preload(bootstrap, inp, pool, n, "pass")
    consumer = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"pass-{uuid.uuid4().hex[:6]}"))
    consumer.assign([TopicPartition(inp, p, OFFSET_BEGINNING) for p in range(2)])
    producer = make_producer(bootstrap, out)
    got = 0
    t0 = time.perf_counter()
    while got < n:
        for m in consumer.consume(num_messages=1000, timeout=0.5):
            if m.error():
                continue
            produce_now(producer, out, m.key(), m.value())
            got += 1
        producer.poll(0)
    producer.flush(60)
    seconds = time.perf_counter() - t0
    consumer.close()
    drop_topics(bootstrap, inp, out)
    return {"requests_per_s": n / seconds, "rows_per_s": n * pool.mean_rows / seconds}


MODEL_PROCESS_ENV = {"TIDEBATCH_RUNTIME__MODEL_PROCESS": "true"}
PINNED_MODEL_PROCESS_ENV = {**MODEL_PROCESS_ENV, "TIDEBATCH_RUNTIME__PIN_EXECUTORS": "true"}


def saturation(bootstrap: str, pool: RequestPool, policy: str, n: int, runtime_env: dict | None = None) -> dict:
    tag = _tag(runtime_env)
    inp, out = fresh_topics(bootstrap, f"bench-sat-{policy}-{pool.encoding}{tag}")
    run = f"sat-{policy}"
    preload(bootstrap, inp, pool, n, run)
    env = {**(STATIC_ENV if policy == "static" else {}), **(runtime_env or {})}
    log_name = f"sat-{policy}-{pool.encoding}{tag}"
    with worker_process(bootstrap, inp, out, policy, extra_env=env, log_name=log_name) as proc:
        # Read the results only after the drain: a reader running alongside would take
        # CPU from the worker on this 2-core machine. Throughput comes from the
        # results' produce timestamps either way.
        wait_outcomes(proc, n)
        res = read_results(bootstrap, out, n, timeout=600, run=run)
    drop_topics(bootstrap, inp, out)
    req_s, rows_s = drain_throughput(res)
    batch = float(np.mean([d["batch_rows"] for d in res.docs]))
    return {"requests_per_s": req_s, "rows_per_s": rows_s, "results": len(res.docs), "mean_batch_rows_seen": batch}


def latency(
    bootstrap: str, pool: RequestPool, policy: str, rate: float, seconds: float, runtime_env: dict | None = None
) -> dict:
    tag = _tag(runtime_env)
    inp, out = fresh_topics(bootstrap, f"bench-lat-{policy}{tag}")
    run = f"lat-{policy}"
    env = {**(STATIC_ENV if policy == "static" else {}), **(runtime_env or {})}
    with worker_process(bootstrap, inp, out, policy, extra_env=env, log_name=f"lat-{policy}{tag}") as proc:
        with cpu_shares(bootstrap, proc.pid) as cores:
            sent = open_loop(bootstrap, inp, pool, rate, seconds, run)
        res = read_results(bootstrap, out, sent, timeout=120, run=run)
        breakdown = stages(proc)
    drop_topics(bootstrap, inp, out)
    p50, p99 = res.percentiles()
    return {"rate": rate, "sent": sent, "results": len(res.docs), "p50_ms": p50, "p99_ms": p99, "cpu_cores": cores,
            "stages": breakdown}


def _tag(runtime_env: dict | None) -> str:
    """Topic and log name suffix of a runtime variant."""
    if not runtime_env:
        return ""
    return "-mp-pinned" if runtime_env.get("TIDEBATCH_RUNTIME__PIN_EXECUTORS") == "true" else "-mp"


def soak(bootstrap: str, pool: RequestPool, rate: float, seconds: float) -> dict:
    """Worker RSS sampled every 10 s at a steady load: memory must stay flat. Each
    sample also has the worker's queued rows and consumer lag: the embedded broker's
    fetch slows as a run's batches pile up (docs/BROKERS.md), and memory has to be read
    against whether the worker was keeping up at the time."""
    import threading

    from pipeline.app.demo import _sum, scrape

    # Long runs: the embedded broker's fetch scans every stored batch of a partition and
    # starves consumers past ~20k batches (docs/BROKERS.md); fewer, bigger producer batches
    # (200 ms linger) over more partitions keep ten minutes well below that.
    inp, out = fresh_topics(bootstrap, "bench-soak", partitions=4)
    samples: list[tuple[float, int, float, float]] = []
    with worker_process(bootstrap, inp, out, "static", extra_env=STATIC_ENV, log_name="soak") as proc:
        stop = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.wait(10):
                rss = _rss_kib(proc.pid)
                try:
                    m = scrape(proc.metrics_url)  # type: ignore[attr-defined]
                    rows, lag = _sum(m, "tidebatch_queue_rows"), _sum(m, "tidebatch_consumer_lag_messages")
                except OSError:
                    rows = lag = float("nan")
                samples.append((round(time.monotonic() - t0), rss, rows, lag))

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        # Rate-limited loop in chunks so the broker's memory stays bounded too.
        open_loop(bootstrap, inp, pool, rate, seconds, "soak", producer_overrides={"linger.ms": 200})
        stop.set()
        th.join()
    rss = [s[1] for s in samples]
    third = max(len(rss) // 3, 1)
    drop_topics(bootstrap, inp, out)
    return {
        "samples": [{"t_s": t, "rss_kib": r, "queue_rows": q, "lag": lag} for t, r, q, lag in samples],
        "max_rss_mib": max(rss) / 1024,
        "max_lag": max(s[3] for s in samples),
        "first_third_mean_mib": float(np.mean(rss[:third])) / 1024,
        "last_third_mean_mib": float(np.mean(rss[-third:])) / 1024,
    }


def soak_table(result: dict) -> str:
    rows = [[s["t_s"], f"{s['rss_kib'] / 1024:.1f}", f"{s['queue_rows']:.0f}", f"{s['lag']:.0f}"]
            for s in result["samples"][::3]]
    return table(["t s", "RSS MiB", "queued rows", "lag"], rows)


def saturation_cases(
    policies: list[str], binary_policies: list[str], pool: RequestPool, binary_pool: RequestPool,
    model_process: bool = True,
) -> list[tuple[str, RequestPool, str, dict | None]]:
    """(label, requests, policy, worker environment) of every saturation row."""
    cases: list[tuple[str, RequestPool, str, dict | None]] = [(p, pool, p, None) for p in policies]
    cases += [(f"{p}, binary requests", binary_pool, p, None) for p in binary_policies]
    if not model_process:
        return cases
    for suffix, env in (("model process", MODEL_PROCESS_ENV), ("model process, pinned cores", PINNED_MODEL_PROCESS_ENV)):
        cases.append((f"static, {suffix}", pool, "static", env))
        cases.append((f"static, binary requests, {suffix}", binary_pool, "static", env))
    return cases


def latency_cases(policies: list[str]) -> list[tuple[str, str, dict | None]]:
    """(label, policy, worker environment) of every latency row, JSON requests."""
    cases: list[tuple[str, str, dict | None]] = [(p, p, None) for p in policies]
    if "adaptive" in policies:
        cases.append(("adaptive, model process", "adaptive", MODEL_PROCESS_ENV))
        cases.append(("adaptive, model process, pinned cores", "adaptive", PINNED_MODEL_PROCESS_ENV))
    return cases


def summarise(runs: list[dict]) -> dict:
    """The median run's figures, with every run's rows/s."""
    by_rate = sorted(runs, key=lambda r: r["rows_per_s"])
    median = by_rate[(len(by_rate) - 1) // 2]  # the lower median: an odd count has one middle
    return {**median, "runs_rows_per_s": [r["rows_per_s"] for r in runs]}


def _peak() -> dict:
    peak = model_peak()
    best = {**peak["best"], **peak["fit"], "pool_rows": peak["pool_rows"]}
    print(f"model peak: {best['rows_per_s']:.0f} rows/s at batch {best['batch']} (1 thread, fresh request rows)",
          flush=True)
    return best


def result_table(report: dict) -> str:
    peak_rows = report["model_peak"]["rows_per_s"]

    def share(rows_per_s: float) -> str:
        return f"{100 * rows_per_s / peak_rows:.0f}%"

    rows = []
    for i, p in enumerate(report["model_peak_runs"]):
        when = "start" if i == 0 else "end"
        rows.append([f"model direct (ORT, 1 thread, batch {p['batch']}), {when}", f"{p['rows_per_s']:.0f}", "-",
                     share(p["rows_per_s"]), "-", "-"])
    pt = report["passthrough"]
    rows.append(["kafka passthrough (no inference)", f"{pt['rows_per_s']:.0f}", f"{pt['requests_per_s']:.0f}",
                 share(pt["rows_per_s"]), "-", "-"])
    latency = report["latency"]
    for label, s in report["saturation"].items():
        spread = s["runs_rows_per_s"]
        rate = f"{s['rows_per_s']:.0f}"
        if len(spread) > 1:
            rate += f" ({min(spread):.0f}-{max(spread):.0f})"
        lat = latency.get(label)
        rows.append([f"pipeline, {label}", rate, f"{s['requests_per_s']:.0f}", share(s["rows_per_s"]),
                     f"{lat['p50_ms']:.1f}" if lat else "-", f"{lat['p99_ms']:.1f}" if lat else "-"])
    for label, lat in latency.items():
        if label not in report["saturation"]:
            rows.append([f"pipeline, {label}", "-", "-", "-", f"{lat['p50_ms']:.1f}", f"{lat['p99_ms']:.1f}"])
    head = (f"mean rows per request: {report['mean_rows_per_request']:.1f}; latency at "
            f"{report['latency_rate']:.0f} req/s (50 % of static saturation); ratios against the higher "
            f"model peak")
    return head + "\n" + table(["path", "rows/s", "req/s", "of model peak", "p50 ms", "p99 ms"], rows)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


_MACHINE = {"kafka": "2 cores, loopback, Apache Kafka (one local node)", "tansu": "2 cores, loopback, embedded broker (Tansu)"}


def run_report(engine: str, args: argparse.Namespace) -> dict:
    """Every measurement of this bench on one kind of broker."""
    policies = args.policies.split(",")
    binary_policies = [p for p in args.binary_policies.split(",") if p]
    report: dict = {"broker": engine, "machine": _MACHINE[engine], "ort_intra_op_threads": 1}
    report["model_peak_runs"] = [_peak()]
    pool = RequestPool()
    binary_pool = RequestPool(encoding="binary")
    report["mean_rows_per_request"] = pool.mean_rows
    report["passthrough"] = fresh(engine, passthrough, pool, args.requests)
    print(f"[{engine}] kafka passthrough: {report['passthrough']['rows_per_s']:.0f} rows/s", flush=True)
    cases = saturation_cases(policies, binary_policies, pool, binary_pool, not args.no_model_process)
    runs: dict[str, list[dict]] = {label: [] for label, *_ in cases}
    for _ in range(args.repeat):
        for label, case_pool, policy, env in cases:
            r = fresh(engine, saturation, case_pool, policy, args.requests, env)
            runs[label].append(r)
            print(f"[{engine}] saturation, {label}: {r['rows_per_s']:.0f} rows/s", flush=True)
    report["saturation"] = {label: summarise(rs) for label, rs in runs.items()}
    static = report["saturation"].get("static") or next(iter(report["saturation"].values()))
    rate = 0.5 * static["requests_per_s"]
    report["latency_rate"] = rate
    report["latency"] = {}
    for label, policy, env in latency_cases(policies):
        r = report["latency"][label] = fresh(engine, latency, pool, policy, rate, args.latency_seconds, env)
        print(f"[{engine}] latency, {label} @ {rate:.0f} req/s: p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms; "
              f"{cpu_text(r['cpu_cores'])}; {stages_text(r['stages'])}", flush=True)
    report["model_peak_runs"].append(_peak())
    report["model_peak"] = max(report["model_peak_runs"], key=lambda p: p["rows_per_s"])
    if args.soak:
        report["soak"] = fresh(engine, soak, pool, rate, args.soak)
    return report


def side_by_side(reports: dict[str, dict]) -> str:
    """rows/s (saturation) and p50/p99 ms (latency) of every case, one column per broker."""
    engines = list(reports)
    labels = list(dict.fromkeys(label for r in reports.values() for label in [*r["saturation"], *r["latency"]]))
    rows = [["kafka passthrough (no inference), rows/s", *(f"{reports[e]['passthrough']['rows_per_s']:.0f}" for e in engines)]]
    for label in labels:
        for kind in ("saturation", "latency"):
            cells = []
            for e in engines:
                got = reports[e][kind].get(label)
                if got is None:
                    cells.append("-")
                elif kind == "saturation":
                    cells.append(f"{got['rows_per_s']:.0f}")
                else:
                    cells.append(f"{got['p50_ms']:.1f} / {got['p99_ms']:.1f} @ {got['rate']:.0f} req/s")
            if any(c != "-" for c in cells):
                what = "rows/s" if kind == "saturation" else "p50 / p99 ms"
                rows.append([f"{label}, {what}", *cells])
    return table(["case", *engines], rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=[*BROKERS, "both"], default="kafka",
                    help="Apache Kafka (default), the embedded Tansu broker, or both side by side")
    ap.add_argument("--requests", type=int, default=20_000, help="backlog size for saturation runs")
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--binary-policies", default="none,static",
                    help="policies measured again with binary-form requests ('' for none)")
    ap.add_argument("--no-model-process", action="store_true",
                    help="leave out the cases with ONNX Runtime in a model process of its own")
    ap.add_argument("--repeat", type=int, default=1, help="drains per saturation case (median reported)")
    ap.add_argument("--soak", type=float, default=0.0, help="seconds of a memory soak at 50 %% load")
    ap.add_argument("--soak-rate", type=float, default=0.0,
                    help="with --soak: run only the soak, at this many requests/s")
    args = ap.parse_args()
    engines = list(BROKERS) if args.broker == "both" else [args.broker]
    OUT.mkdir(parents=True, exist_ok=True)
    if args.soak and args.soak_rate:
        for engine in engines:
            with local_broker(engine) as broker:
                result = soak(broker.bootstrap_servers, RequestPool(), args.soak_rate, args.soak)
            (OUT / f"soak-{engine}.json").write_text(json.dumps(result, indent=2))
            print(soak_table(result))
            print(f"[{engine}] soak at {args.soak_rate:.0f} req/s for {args.soak:.0f} s: worker RSS "
                  f"{result['first_third_mean_mib']:.1f} MiB (first third) -> "
                  f"{result['last_third_mean_mib']:.1f} MiB (last third), max {result['max_rss_mib']:.1f} MiB; "
                  f"max lag {result['max_lag']:.0f} (out/bench/soak-{engine}.json)")
        return 0

    reports = {engine: run_report(engine, args) for engine in engines}
    for report in reports.values():
        print(f"\n{report['machine']}")
        print(result_table(report))
        if "soak" in report:
            s = report["soak"]
            print(f"soak: worker RSS {s['first_third_mean_mib']:.1f} MiB (first third) -> "
                  f"{s['last_third_mean_mib']:.1f} MiB (last third)")
    if len(reports) > 1:
        print("\nside by side (same run, a fresh broker per measurement):")
        print(side_by_side(reports))
    (OUT / "pipeline_capacity.json").write_text(json.dumps(reports if len(reports) > 1 else reports[engines[0]], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
