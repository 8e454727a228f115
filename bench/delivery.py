"""Issue 18's measurement: exactly-once delivery (Kafka transactions) against
at-least-once, in one run on one Apache Kafka broker (one local node), with fresh
topics and a fresh `tidebatch run` worker for every cell:

- saturation: a preloaded backlog of --requests CTR requests drained by the worker with
  delivery at_least_once, then exactly_once at transaction_interval_ms 20 / 100 / 500
  (--intervals). The drain runs from the first result's timestamp until the last result
  is *readable* by a read_committed reader: for at-least-once that is the last result's
  own timestamp (a record outside a transaction is readable once written); for
  exactly-once it is the commit of the last transaction, seen by polling the worker
  group's committed input offsets every 25 ms (the worker commits them in the same
  transaction as the results, so they become visible together). The rate from the
  results' timestamps alone (`produced`) stops at the last produce and leaves out that
  final commit; it is given as well.
- latency: p50 / p99 end to end at --load (50 %) of the at-least-once saturation just
  measured, open-loop Poisson arrivals for --seconds per mode. Measured by a
  read_committed consumer of the output topic, in a process of its own started before
  the load: latency = when the reader got the result (its clock) - the request's
  CreateTime (the worker copies it into the result as kafka_ts_ms). Not the result
  record's timestamp: that is set when the result is produced, before its transaction
  commits, so it would hide the wait for the commit, which is what exactly-once costs.
  The timestamp-based figures are in the JSON (`p50_produced_ms`, `p99_produced_ms`) for
  comparison. The reader also counts duplicates and missing results.
- the cores used meanwhile by the generator (this process), the worker, the broker and
  the reader (bench/harness.py cpu_shares), and by anything else on the machine
  ("others", from /proc/stat, plus what a VM's hypervisor stole): a run during which
  others took more than a quarter of a core is measured again (--retries, 2), and
  marked "disturbed" in the table if it stays so.
- from the worker's metrics: its transaction commits, their mean time and how often
  they actually happened (commits happen between turns of the worker's source loop,
  so the interval is a lower bound).

    .venv/bin/python bench/delivery.py [--requests 20000] [--seconds 10] [--repeat 1]
        [--intervals 20,100,500] [--load 0.5] [--policy static] [--retries 2]

With --repeat N every cell runs N times, the modes taking turns in an order rotated
each round (so the machine's drift spreads over all of them); the tables give the
median with the range. Prints a table of the figures and one of ratios exactly_once /
at_least_once, and writes out/bench/delivery.json. Issue 18's target: exactly-once
saturation >= 80 % of at-least-once's. An exactly_once cell whose output holds no
transaction markers (the worker did not use transactions) is flagged in both.
Timings on this 2-core machine are noisy: compare rows of one run, not runs. One run
takes ~2.5 min with the defaults, ~6 min with --repeat 3 (more when runs are redone).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    OUT,
    RequestPool,
    cpu_shares,
    cpu_text,
    drain_throughput,
    drop_topics,
    fresh_topics,
    local_broker,
    open_loop,
    preload,
    profile_of,
    read_results,
    stages,
    stages_text,
    table,
    worker_process,
)
from bench.pipeline_capacity import STATIC_ENV  # noqa: E402

ALO = "at_least_once"
EOS = "exactly_once"
POLL_S = 0.025  # committed-offsets poll: the resolution of an exactly-once drain's end
TARGET = 0.8  # issue 18: exactly-once saturation >= 80 % of at-least-once's
# A run during which processes other than the bench's own used this many cores (or the
# hypervisor stole them) shared the machine: flagged, since on two cores its figures
# say more about the neighbour than about the delivery mode.
DISTURBED_CORES = 0.25


def disturbed(run: dict) -> bool:
    cores = run.get("cpu_cores", {})
    return cores.get("others", 0.0) + cores.get("stolen", 0.0) > DISTURBED_CORES


@dataclass(frozen=True)
class Mode:
    label: str  # "at_least_once", "exactly_once 100 ms"
    delivery: str
    interval_ms: int | None = None

    def env(self) -> dict[str, str]:
        env = {"TIDEBATCH_DELIVERY": self.delivery}
        if self.interval_ms is not None:
            env["TIDEBATCH_TRANSACTION_INTERVAL_MS"] = str(self.interval_ms)
        return env

    @property
    def tag(self) -> str:
        """Topic and log name part: alo, eos20, eos100, ..."""
        return "alo" if self.delivery == ALO else f"eos{self.interval_ms}"


def modes(intervals: list[int]) -> list[Mode]:
    return [Mode(ALO, ALO), *(Mode(f"{EOS} {ms} ms", EOS, ms) for ms in intervals)]


def policy_env(policy: str, backlog: bool) -> dict[str, str]:
    """The worker's batching settings: pipeline_capacity's static reference (1024 rows,
    10 ms), or another policy as configured. A preloaded backlog is older than any SLO,
    so a backlog drain lifts it (as bench/policies.py does)."""
    if policy == "static":
        return dict(STATIC_ENV)
    return {"TIDEBATCH_BATCHING__SLO_MS": "3600000"} if backlog else {}


def rotated(items: list, round_no: int) -> list:
    """The cases in the order of round `round_no`: each round starts one case later."""
    k = round_no % len(items) if items else 0
    return items[k:] + items[:k]


# ------------------------------------------------------------------------- saturation
def drain_rates(n: int, rows: int, first_ts_ms: float, last_ts_ms: float, committed_ms: float | None,
                delivery: str) -> dict:
    """A drain's rates. `readable` ends when the last result can be read by a
    read_committed reader: the last result's timestamp under at-least-once (no
    transaction), the observed commit of the last transaction under exactly-once (never
    before the last result's own timestamp). `produced` ends at the last result's
    timestamp in both modes."""
    produced_s = max(last_ts_ms - first_ts_ms, 1.0) / 1000.0
    end_ms = last_ts_ms
    if delivery == EOS:
        if committed_ms is None:
            raise ValueError("an exactly_once drain needs the time its last transaction committed")
        end_ms = max(last_ts_ms, committed_ms)
    readable_s = max(end_ms - first_ts_ms, 1.0) / 1000.0
    return {
        "requests_per_s": n / readable_s, "rows_per_s": rows / readable_s,
        "produced_requests_per_s": n / produced_s, "produced_rows_per_s": rows / produced_s,
        "drain_s": readable_s, "final_commit_wait_ms": end_ms - last_ts_ms,
    }


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark of every partition of `topic` (no transactions in it: a count)."""
    from confluent_kafka import Consumer, TopicPartition

    from consumers.admin import existing_topics
    from consumers.profiles import consumer_config

    c = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"bench-wm-{uuid.uuid4().hex[:8]}"))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(existing_topics(bootstrap)[topic])}
    finally:
        c.close()


def wait_committed(bootstrap: str, proc, topic: str, ends: dict[int, int], timeout: float) -> float:
    """Poll the worker group's committed offsets of `topic` until every partition's
    reaches `ends`; the wall-clock time (ms) it was first seen. Stable offsets only
    (require_stable off): under exactly-once they appear when their transaction commits."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(proc.group_id, [TopicPartition(topic, p) for p in ends])]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode} mid-drain; see {proc.log_path}")
        try:
            got = admin.list_consumer_group_offsets(request)[proc.group_id].result(timeout=5)
            if all(tp.offset >= ends[tp.partition] for tp in got.topic_partitions if tp.error is None) \
                    and len(got.topic_partitions) == len(ends):
                return time.time() * 1000.0
        except Exception:  # the group may not exist yet: keep polling
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"the worker's offsets of {topic} did not reach the end in {timeout:.0f} s; see {proc.log_path}")


def markers(bootstrap: str, topic: str, records: int) -> int:
    """Offsets in `topic` not taken by its `records` distinct records: transaction
    control markers (one per partition a transaction wrote to), and duplicates if any.
    0 means no transactions."""
    return sum(end_offsets(bootstrap, topic).values()) - records


def transaction_stats(proc, seconds: float) -> dict:
    """The worker's transaction metrics so far (pipeline/observe/metrics.py): commits, their mean
    time, aborts, every transaction sample as it was scraped, and the mean time between
    commits over the `seconds` the worker had work (the setting is a lower bound: the
    worker commits between turns of its source loop). Empty under at-least-once."""
    from pipeline.app.demo import _sum, scrape

    try:
        m = scrape(proc.metrics_url)
    except OSError:
        return {}
    samples = {k: v for k, v in m.items() if "transaction" in k}
    if not samples:
        return {}
    count = _sum(m, "tidebatch_transaction_commit_seconds_count")
    total = _sum(m, "tidebatch_transaction_commit_seconds_sum")
    return {
        "commits": count, "mean_commit_ms": 1000.0 * total / count if count else float("nan"),
        "aborted": sum(v for k, v in samples.items() if "abort" in k and not k.endswith("_created")),
        "commit_period_ms": 1000.0 * seconds / count if count else float("nan"),
        "samples": samples,
    }


def saturation(bootstrap: str, pool: RequestPool, mode: Mode, n: int, policy: str) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-eos-sat-{mode.tag}")
    run = f"sat{uuid.uuid4().hex[:6]}"
    preload(bootstrap, inp, pool, n, run)
    ends = {p: end for p, end in end_offsets(bootstrap, inp).items() if end > 0}  # nothing to commit in an empty one
    env = {**policy_env(policy, backlog=True), **mode.env()}
    with worker_process(bootstrap, inp, out, policy, extra_env=env, log_name=f"delivery-sat-{mode.tag}") as proc:
        # The worker drains from its start; the window of cpu_shares starts when it has
        # partitions (~1 s into the drain) and ends at the commit of its last offsets.
        # No reader alongside: it would take CPU from the worker on two cores.
        with cpu_shares(bootstrap, proc.pid, machine=True) as cores:
            committed_ms = wait_committed(bootstrap, proc, inp, ends, timeout=600)
        res = read_results(bootstrap, out, n, timeout=600, run=run)  # read_committed: librdkafka's default
        drain_s = (max(committed_ms, float(res.result_ts_ms.max())) - float(res.result_ts_ms.min())) / 1000.0
        txn = transaction_stats(proc, drain_s)
    txn_markers = markers(bootstrap, out, len(res.docs))
    drop_topics(bootstrap, inp, out)
    if len(res.docs) < n:
        raise RuntimeError(f"{mode.label}: {len(res.docs)} results of {n} readable after the drain")
    rows = sum(len(d["scores"]) for d in res.docs)
    rates = drain_rates(n, rows, float(res.result_ts_ms.min()), float(res.result_ts_ms.max()), committed_ms,
                        mode.delivery)
    _, check_rows = drain_throughput(res)
    assert abs(check_rows - rates["produced_rows_per_s"]) <= 1e-6 * check_rows + 1e-9
    return {**rates, "results": len(res.docs), "txn_markers": txn_markers,
            "offsets_committed_after_last_result_ms": committed_ms - float(res.result_ts_ms.max()),
            "mean_batch_rows_seen": float(np.mean([d["batch_rows"] for d in res.docs])), "cpu_cores": cores,
            "transactions": txn,
            "no_transactions": mode.delivery == EOS and txn_markers <= 0}


# ---------------------------------------------------------------------------- latency
def _reader_main(bootstrap: str, profile: str, topic: str, parts: int, run: str, ready, expect, stop, conn) -> None:
    """A read_committed consumer of the results (process of its own): for every result
    of `run`, (read time - request CreateTime, result CreateTime - request CreateTime)
    in ms, the read time from this process's clock as each record is polled."""
    import orjson
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from consumers.profiles import consumer_config

    consumer = Consumer(consumer_config(profile, bootstrap, f"bench-rc-{uuid.uuid4().hex[:8]}",
                                        {"isolation.level": "read_committed"}))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(parts)])
    consumer.poll(1.0)  # connected, fetching
    ready.set()
    seen: dict[str, tuple[float, float]] = {}
    duplicates = 0
    stop_at = None
    try:
        while True:
            want = expect.value
            if want and len(seen) >= want:
                break
            if stop.is_set():
                stop_at = stop_at or time.monotonic() + 60.0  # the tail: last commits, a slow worker
                if time.monotonic() > stop_at:
                    break
            m = consumer.poll(0.05)
            if m is None or m.error():
                continue
            read_ms = time.time() * 1000.0
            doc = orjson.loads(m.value())
            rid = doc.get("request_id", "")
            if not rid.startswith(run + "-"):
                continue
            if rid in seen:
                duplicates += 1
                continue
            req = float(doc["kafka_ts_ms"])
            seen[rid] = (read_ms - req, m.timestamp()[1] - req)
    finally:
        consumer.close()
    conn.send({"read": [v[0] for v in seen.values()], "produced": [v[1] for v in seen.values()],
               "duplicates": duplicates})
    conn.close()


class Reader:
    """The read_committed reader process; start() returns once it fetches."""

    def __init__(self, bootstrap: str, topic: str, parts: int, run: str) -> None:
        ctx = mp.get_context("spawn")  # no fork of a process with librdkafka threads
        self.ready, self.stop = ctx.Event(), ctx.Event()
        self.expect = ctx.Value("q", 0)
        self.conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_reader_main, daemon=True, args=(
            bootstrap, profile_of(bootstrap), topic, parts, run, self.ready, self.expect, self.stop, child))

    def start(self) -> int:
        self.proc.start()
        if not self.ready.wait(60):
            raise RuntimeError("the read_committed reader did not start in 60 s")
        return self.proc.pid

    def finish(self, sent: int, timeout: float = 90.0) -> dict:
        self.expect.value = sent
        self.stop.set()
        if not self.conn.poll(timeout):
            self.proc.kill()
            raise RuntimeError("the read_committed reader sent nothing back")
        got = self.conn.recv()
        self.proc.join(10)
        return got


def latency_summary(read_ms: list[float], produced_ms: list[float], sent: int, duplicates: int) -> dict:
    """Percentiles of the latency as read (primary) and as the result timestamps say."""
    read, produced = np.asarray(read_ms, dtype=float), np.asarray(produced_ms, dtype=float)
    if not len(read):
        return {"sent": sent, "results": 0, "missing": sent, "duplicates": duplicates}
    return {
        "sent": sent, "results": len(read), "missing": sent - len(read), "duplicates": duplicates,
        "p50_ms": float(np.percentile(read, 50)), "p99_ms": float(np.percentile(read, 99)),
        "p50_produced_ms": float(np.percentile(produced, 50)), "p99_produced_ms": float(np.percentile(produced, 99)),
        "mean_commit_wait_ms": float(np.mean(read - produced)),
        "p50_wait_ms": float(np.percentile(read - produced, 50)), "p99_wait_ms": float(np.percentile(read - produced, 99)),
    }


def latency(bootstrap: str, pool: RequestPool, mode: Mode, rate: float, seconds: float, policy: str) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-eos-lat-{mode.tag}")
    run = f"lat{uuid.uuid4().hex[:6]}"
    reader = Reader(bootstrap, out, 2, run)
    reader_pid = reader.start()
    env = {**policy_env(policy, backlog=False), **mode.env()}
    try:
        with worker_process(bootstrap, inp, out, policy, extra_env=env, log_name=f"delivery-lat-{mode.tag}") as proc:
            with cpu_shares(bootstrap, proc.pid, {"reader": reader_pid}, machine=True) as cores:
                sent = open_loop(bootstrap, inp, pool, rate, seconds, run)
            got = reader.finish(sent)
            breakdown = stages(proc)
            txn = transaction_stats(proc, seconds)
    finally:
        if reader.proc.is_alive():
            reader.proc.kill()
    drop_topics(bootstrap, inp, out)
    return {"rate": rate, **latency_summary(got["read"], got["produced"], sent, got["duplicates"]),
            "cpu_cores": cores, "stages": breakdown, "transactions": txn}


# ---------------------------------------------------------------------------- reports
def summarise(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """Over the runs of one cell: the median of each of `keys` (the mean of the middle
    two for an even count), every run's value as runs_<key>, and the other fields of
    the run nearest the median of the first key."""
    med = {k: float(np.median([r[k] for r in runs])) for k in keys}
    nearest = min(runs, key=lambda r: abs(r[keys[0]] - med[keys[0]]))
    return {**nearest, **med, **{f"runs_{k}": [r[k] for r in runs] for k in keys}}


SAT_KEYS = ("requests_per_s", "produced_requests_per_s", "rows_per_s", "produced_rows_per_s", "final_commit_wait_ms")
LAT_KEYS = ("p99_ms", "p50_ms", "p50_produced_ms", "p99_produced_ms", "mean_commit_wait_ms", "p50_wait_ms",
            "p99_wait_ms")


def ratios(report: dict) -> list[dict]:
    """exactly_once / at_least_once for every exactly-once mode: saturation (readable and
    produced) and latency p50 / p99 (as read)."""
    sat, lat = report["saturation"], report.get("latency", {})
    base_s, base_l = sat[ALO], lat.get(ALO)
    rows = []
    for label, s in sat.items():
        if label == ALO:
            continue
        row = {"mode": label,
               "saturation": s["requests_per_s"] / base_s["requests_per_s"],
               "saturation_produced": s["produced_requests_per_s"] / base_s["produced_requests_per_s"]}
        if base_l and label in lat and "p50_ms" in lat[label]:
            row["p50"] = lat[label]["p50_ms"] / base_l["p50_ms"]
            row["p99"] = lat[label]["p99_ms"] / base_l["p99_ms"]
            if "p50_wait_ms" in base_l:  # ms a result waits longer, once produced, to be readable
                row["wait_p50_added_ms"] = lat[label]["p50_wait_ms"] - base_l["p50_wait_ms"]
                row["wait_p99_added_ms"] = lat[label]["p99_wait_ms"] - base_l["p99_wait_ms"]
        row["meets_target"] = row["saturation"] >= TARGET
        rows.append(row)
    return rows


def undisturbed(measure, describe, retries: int, redone: list[dict]) -> dict:
    """measure() again, up to `retries` times, while other work on the machine disturbed
    it; the last run is kept (marked if still disturbed), the others go to `redone`."""
    for attempt in range(retries + 1):
        r = measure()
        describe(r)
        if not disturbed(r) or attempt == retries:
            return r
        print(f"  disturbed (others {r['cpu_cores'].get('others', 0):.2f}, stolen "
              f"{r['cpu_cores'].get('stolen', 0):.2f} cores): measured again", flush=True)
        redone.append(r)
    raise AssertionError("unreachable")


def _sat_line(mode: Mode, r: dict) -> None:
    flag = "  NO TRANSACTION MARKERS: the worker did not use transactions" if r["no_transactions"] else ""
    print(f"saturation, {mode.label}: {r['requests_per_s']:.0f} req/s readable "
          f"({r['produced_requests_per_s']:.0f} produced, last commit +{r['final_commit_wait_ms']:.0f} ms, "
          f"{r['txn_markers']} markers{_txn_text(r)}); {cpu_text(r['cpu_cores'])}{flag}", flush=True)


def _lat_line(mode: Mode, rate: float, r: dict) -> None:
    if "p50_ms" not in r:
        print(f"latency, {mode.label}: NO RESULTS read of {r['sent']}", flush=True)
        return
    print(f"latency, {mode.label} @ {rate:.0f} req/s: p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} ms as read "
          f"(result timestamps: {r['p50_produced_ms']:.1f} / {r['p99_produced_ms']:.1f}); "
          f"dup {r['duplicates']} missing {r['missing']}{_txn_text(r)}; {cpu_text(r['cpu_cores'])}; "
          f"{stages_text(r['stages'])}", flush=True)


def _txn_text(r: dict) -> str:
    t = r.get("transactions") or {}
    if not t:
        return ""
    return (f"; {t['commits']:.0f} commits (one per {t['commit_period_ms']:.0f} ms), mean {t['mean_commit_ms']:.1f} ms, "
            f"{t['aborted']:.0f} aborted")


def _periods(sat: dict, lat: dict) -> str:
    """Mean time between the worker's commits: during the drain / at the latency load."""
    cells = [f"{r['transactions']['commit_period_ms']:.0f}" if r.get("transactions") else "-" for r in (sat, lat)]
    return "-" if cells == ["-", "-"] else " / ".join(cells)


def _spread(values: list[float], fmt: str = "{:.0f}") -> str:
    return f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else ""


def figures_table(report: dict) -> str:
    rows = []
    for label, s in report["saturation"].items():
        lat = report.get("latency", {}).get(label, {})
        cores = lat.get("cpu_cores") or {**s["cpu_cores"], "reader": float("nan")}
        rows.append([
            label + (" (NO TRANSACTIONS SEEN)" if s.get("no_transactions") else ""),
            f"{s['requests_per_s']:.0f}" + _spread(s["runs_requests_per_s"]) + _marks(s),
            f"{s['produced_requests_per_s']:.0f}",
            f"{s['final_commit_wait_ms']:.0f}",
            f"{s['txn_markers']}",
            f"{s['transactions']['mean_commit_ms']:.1f}" if s.get("transactions") else "-",
            _periods(s, lat),
            f"{lat['p50_ms']:.1f}" + _spread(lat["runs_p50_ms"]) + _marks(lat) if "p50_ms" in lat else "-",
            f"{lat['p99_ms']:.1f}" + _spread(lat["runs_p99_ms"]) if "p99_ms" in lat else "-",
            f"{lat['p50_produced_ms']:.1f} / {lat['p99_produced_ms']:.1f}" if "p50_ms" in lat else "-",
            f"{lat['p50_wait_ms']:.1f} / {lat['p99_wait_ms']:.1f}" if "p50_ms" in lat else "-",
            f"{lat['duplicates_all_runs']} / {lat['missing_all_runs']} of {lat['sent_all_runs']}" if lat else "-",
            " / ".join(f"{cores.get(k, float('nan')):.2f}" for k in ("generator", "worker", "broker", "reader", "others")),
        ])
    return table(["mode", "sat req/s", "produced req/s", "final commit wait ms", "txn markers", "mean commit ms",
                  "commit every ms: sat / lat", "p50 ms", "p99 ms", "ts-based p50/p99", "read-ts p50/p99",
                  "dup / missing (all runs)", "cores at latency load: gen / worker / broker / reader / others"], rows)


def _marks(cell: dict) -> str:
    n, redone = cell.get("disturbed_runs", 0), len(cell.get("redone_runs", []))
    parts = ([f"{n} disturbed"] if n else []) + ([f"{redone} redone"] if redone else [])
    return f" [{', '.join(parts)}]" if parts else ""


def ratio_table(report: dict) -> str:
    rows = [[r["mode"], f"{r['saturation']:.2f}", f"{r['saturation_produced']:.2f}",
             f"{r['p50']:.2f}" if "p50" in r else "-", f"{r['p99']:.2f}" if "p99" in r else "-",
             f"+{r['wait_p50_added_ms']:.0f} / +{r['wait_p99_added_ms']:.0f}" if "wait_p50_added_ms" in r else "-",
             "yes" if r["meets_target"] else "NO"] for r in report["ratios"]]
    return table(["exactly_once / at_least_once", "saturation", "sat. (produced)", "p50", "p99",
                  "read-ts wait added, p50 / p99 ms", f">= {TARGET:.0%} target"], rows)


def run_report(args: argparse.Namespace) -> dict:
    cases = modes([int(x) for x in args.intervals.split(",") if x])
    pool = RequestPool()
    report: dict = {
        "broker": "kafka", "machine": "2 cores, loopback, Apache Kafka (one local node)", "policy": args.policy,
        "requests": args.requests, "latency_seconds": args.seconds, "repeat": args.repeat,
        "mean_rows_per_request": pool.mean_rows,
        "latency_measured": "read time of a read_committed consumer (its clock) - request CreateTime; "
                            "the result record's timestamp is set before its transaction commits",
    }
    with local_broker("kafka") as broker:
        bs = broker.bootstrap_servers
        sat_runs: dict[str, list[dict]] = {m.label: [] for m in cases}
        redone: dict[str, list[dict]] = {m.label: [] for m in cases}
        for k in range(args.repeat):
            for mode in rotated(cases, k):
                sat_runs[mode.label].append(undisturbed(
                    lambda mode=mode: saturation(bs, pool, mode, args.requests, args.policy),
                    lambda r, mode=mode: _sat_line(mode, r), args.retries, redone[mode.label]))
        report["saturation"] = {label: {**summarise(rs, SAT_KEYS),
                                        "no_transactions": any(r["no_transactions"] for r in rs),
                                        "disturbed_runs": sum(disturbed(r) for r in rs),
                                        "redone_runs": redone[label]}
                                for label, rs in sat_runs.items()}
        rate = args.load * report["saturation"][ALO]["requests_per_s"]
        report["latency_rate"] = rate
        lat_runs: dict[str, list[dict]] = {m.label: [] for m in cases}
        lat_redone: dict[str, list[dict]] = {m.label: [] for m in cases}
        for k in range(args.repeat if args.seconds > 0 else 0):
            for mode in rotated(cases, k):
                lat_runs[mode.label].append(undisturbed(
                    lambda mode=mode: latency(bs, pool, mode, rate, args.seconds, args.policy),
                    lambda r, mode=mode: _lat_line(mode, rate, r), args.retries, lat_redone[mode.label]))
        report["latency"] = {label: {**summarise([r for r in rs if "p50_ms" in r], LAT_KEYS),
                                     "sent_all_runs": sum(r["sent"] for r in rs),
                                     "duplicates_all_runs": sum(r["duplicates"] for r in rs),
                                     "missing_all_runs": sum(r["missing"] for r in rs),
                                     "disturbed_runs": sum(disturbed(r) for r in rs),
                                     "redone_runs": lat_redone[label]}
                             for label, rs in lat_runs.items() if any("p50_ms" in r for r in rs)}
    report["ratios"] = ratios(report)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="backlog size of a saturation drain")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of a latency run (0: no latency runs)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell, modes taking turns (median reported)")
    ap.add_argument("--intervals", default="20,100,500", help="exactly_once transaction_interval_ms values")
    ap.add_argument("--retries", type=int, default=2,
                    help="runs of a cell measured again when other work on the machine disturbed them")
    ap.add_argument("--load", type=float, default=0.5, help="latency load, share of at-least-once saturation")
    ap.add_argument("--policy", default="static", choices=("static", "adaptive", "greedy", "none"),
                    help="batching policy (static: pipeline_capacity's 1024 rows / 10 ms)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    report = run_report(args)
    report["wall_s"] = time.monotonic() - t0
    path = OUT / "delivery.json"
    path.write_text(json.dumps(report, indent=2, default=float))  # before the tables: a figure is never lost
    print(f"\n{report['machine']}; policy {args.policy}; {args.requests} requests per drain "
          f"({report['mean_rows_per_request']:.1f} rows each); latency at {report['latency_rate']:.0f} req/s "
          f"({100 * args.load:.0f} % of at-least-once saturation), {args.seconds:.0f} s per run; "
          f"{args.repeat} run(s) per cell, median (range)")
    print("sat req/s: until the last result is readable read_committed (exactly_once: its last commit); "
          "produced: until the last result's timestamp.\nlatency: read time at a read_committed reader - "
          "request CreateTime (ts-based: result timestamp - request CreateTime, hides the commit wait; "
          "read-ts: the wait between a result's produce and its being readable).\n"
          f"[n disturbed]: runs kept although other work on the machine (or the hypervisor) took > "
          f"{DISTURBED_CORES} core (cores: others); [n redone]: such runs measured again (--retries).")
    print(figures_table(report))
    print()
    print(ratio_table(report))
    print(f"\njson: {path} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
