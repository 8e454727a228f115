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
Its parts: bench/delivery_cells.py (the arithmetic), bench/delivery_probes.py (offsets,
commits and metrics read), bench/delivery_runs.py (the two measurements),
bench/delivery_tables.py (the output).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery_cells import (  # noqa: E402
    ALO,
    DISTURBED_CORES,
    LAT_KEYS,
    SAT_KEYS,
    disturbed,
    modes,
    ratios,
    summarise,
    undisturbed,
)
from bench.delivery_runs import latency, saturation  # noqa: E402
from bench.delivery_tables import figures_table, lat_line, ratio_table, sat_line  # noqa: E402
from bench.harness import OUT, RequestPool, local_broker  # noqa: E402
from bench.rounds import rotated  # noqa: E402


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
                    lambda r, mode=mode: sat_line(mode, r), args.retries, redone[mode.label]))
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
                    lambda r, mode=mode: lat_line(mode, rate, r), args.retries, lat_redone[mode.label]))
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
