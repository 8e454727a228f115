"""Real-pipeline comparison of batching policies (issues 3 and 10), in one run:

1. capacity, two ways: a `tidebatch run` worker (adaptive) drains a preloaded backlog
   (no generator, no live fetches: an upper bound), and the live capacity, the highest
   rate greedy keeps up with while this process generates the load and the broker is in
   the loop (bisection between 0 and the drained figure; issue 26). 100 % load is the
   live one unless --load-basis drained;
2. steady loads at 10 %, 50 % and 90 % of it, and on/off bursts, for none, static-64
   (64 rows / 10 ms, as commonly deployed), static-tuned (the static configuration
   best at 50 % load, from a small grid run here), greedy and adaptive;
3. the overload scenarios: 50 % with a 10 s burst at 150 %, a sustained 120 %
   overload, and two priority classes (20 % high, 80 % low) at 110 % — for greedy,
   static-64 and adaptive — with goodput, recovery time and outcome counts.

    .venv/bin/python bench/policies.py [--seconds 15] [--quick] [--camera-text]

Prints tables, draws out/bench/policies-BROKER.png, writes out/bench/policies-BROKER.json
(--broker kafka, the default, or tansu; --broker both runs each on a broker of its own
and then prints them side by side). Every steady-load line gives the cores the
generator (this process), the worker and the broker used meanwhile: they share the
machine's two cores, so a latency figure is read with that split.
--camera-text then runs the camera and text pipelines' section (bench/camera_text.py:
none/static/adaptive on frames, bucketed vs pad-to-longest vs no batching on texts).
Timings on this 2-core machine are noisy: compare rows of one run, not runs.
Its parts: bench/policies_scenario.py (one row), bench/policies_capacity.py (the
capacities the loads are shares of), bench/policies_tables.py (tables and plot).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import BROKERS, OUT, RequestPool, cpu_text, local_broker, stages_text  # noqa: E402
from bench.policies_capacity import measure_capacity  # noqa: E402
from bench.policies_scenario import (  # noqa: E402
    SLO_MS,
    high_priority,
    public,
    recovery_s,
    run_scenario,
    window_goodput,
)
from bench.policies_tables import plot, print_tables, side_by_side  # noqa: E402


def tune_static(bs: str, pool: RequestPool, rate: float, seconds: float) -> tuple[dict[str, str], list]:
    grid = [(rows, delay) for rows in (16, 64, 256) for delay in (2, 10)]
    trials = []
    for rows, delay in grid:
        env = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": str(rows), "TIDEBATCH_BATCHING__MAX_QUEUE_DELAY_MS": str(delay)}
        r = run_scenario(bs, pool, "static-tuned", rate, seconds, tuned=env)
        trials.append({"max_batch_rows": rows, "max_queue_delay_ms": delay, "p99_ms": r["p99_ms"]})
        print(f"  static {rows} rows / {delay} ms at 50 %: p99 {r['p99_ms']:.1f} ms", flush=True)
    best = min(trials, key=lambda t: t["p99_ms"])
    env = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": str(best["max_batch_rows"]),
           "TIDEBATCH_BATCHING__MAX_QUEUE_DELAY_MS": str(best["max_queue_delay_ms"])}
    return env, trials


STEADY_POLICIES = ["none", "static-64", "static-tuned", "greedy", "adaptive"]
OVER_POLICIES = ["greedy", "static-64", "adaptive", "adaptive-score"]
LOADS = [0.1, 0.5, 0.9]


def run_report(engine: str, args: argparse.Namespace, pool: RequestPool) -> dict:
    """Capacity, steady loads and overload scenarios on one broker of its own."""
    seconds = 6.0 if args.quick else args.seconds
    report: dict = {"broker": engine, "slo_ms": SLO_MS, "mean_rows_per_request": pool.mean_rows}
    with local_broker(engine) as broker:
        bs = broker.bootstrap_servers
        report.update(measure_capacity(bs, pool, args.backlog, seconds, 3 if args.quick else 5, engine))
        drained, live = report["drained_capacity_req_s"], report["live_capacity_req_s"]
        # Loads (10/50/90 %, bursts, overload) are fractions of this capacity.
        capacity = live if args.load_basis == "live" else drained
        report["load_basis"] = args.load_basis
        report["capacity_req_s"] = capacity
        report["capacity_rows_s"] = capacity * report["drained_capacity_rows_s"] / drained

        if args.quick or args.overload_only:
            tuned = {"TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "64", "TIDEBATCH_BATCHING__MAX_QUEUE_DELAY_MS": "2"}
            report["static_tuned_grid"] = []
        else:
            tuned, report["static_tuned_grid"] = tune_static(bs, pool, 0.5 * capacity, seconds * 0.6)
        report["static_tuned"] = tuned
        print(f"[{engine}] static-tuned: {tuned}", flush=True)

        policies = [] if args.overload_only else STEADY_POLICIES
        steady: dict = {p: {} for p in policies}
        for p in policies:
            for load in LOADS:
                r = run_scenario(bs, pool, p, load * capacity, seconds, tuned)
                steady[p][load] = r
                print(f"[{engine}] {p:13s} {int(load * 100):3d}%: p50 {r['p50_ms']:7.1f} p99 {r['p99_ms']:8.1f} ms "
                      f"miss {100 * r['slo_miss_rate']:5.1f}% batch {r['mean_batch_rows']:6.1f}; "
                      f"{cpu_text(r['cpu_cores'])}; {stages_text(r['stages'])}", flush=True)
            period = 4.0

            def onoff(t: float, period: float = period) -> float:
                return (1.5 if (t % period) < 1.0 else 0.2) * capacity

            r = run_scenario(bs, pool, p, onoff, seconds, tuned)
            steady[p]["onoff"] = r
            print(f"[{engine}] {p:13s} on/off: p50 {r['p50_ms']:7.1f} p99 {r['p99_ms']:8.1f} ms "
                  f"miss {100 * r['slo_miss_rate']:5.1f}%", flush=True)
        report["steady"] = {p: {str(k): public(v) for k, v in d.items()} for p, d in steady.items()}

        scen: dict = {p: {} for p in OVER_POLICIES}
        burst_len = 6.0 if args.quick else 10.0
        pre, post = 3.0, 8.0 if args.quick else 10.0

        def burst(t: float) -> float:
            return (1.5 if pre <= t < pre + burst_len else 0.5) * capacity

        for p in OVER_POLICIES:
            r = run_scenario(bs, pool, p, burst, pre + burst_len + post)
            r["burst_goodput_x_capacity"] = window_goodput(r, pre, pre + burst_len) / capacity
            r["recovery_s"] = recovery_s(r, pre + burst_len)
            scen[p]["burst"] = r
            r2 = run_scenario(bs, pool, p, 1.2 * capacity, seconds)
            r2["goodput_x_capacity"] = window_goodput(r2, 2.0, seconds) / capacity
            scen[p]["overload"] = r2
            r3 = run_scenario(bs, pool, p, 1.1 * capacity, seconds,
                              priority_fn=high_priority)
            hi = r3["_prio"] == 0
            r3["high_p99_ms"] = float(np.percentile(r3["_lat"][hi], 99)) if hi.any() else float("nan")
            r3["low_p99_ms"] = float(np.percentile(r3["_lat"][~hi], 99)) if (~hi).any() else float("nan")
            scen[p]["priorities"] = r3
            print(f"[{engine}] {p:14s} burst goodput {r['burst_goodput_x_capacity']:.2f}x cap, recovery "
                  f"{r['recovery_s']:.1f} s; overload goodput {r2['goodput_x_capacity']:.2f}x; "
                  f"high-prio p99 {r3['high_p99_ms']:.0f} ms", flush=True)
        report["overload"] = {p: {k: public(v) for k, v in d.items()} for p, d in scen.items()}
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=[*BROKERS, "both"], default="kafka",
                    help="Apache Kafka, one local node (default), the embedded Tansu broker, or both "
                         "(one after the other, then a side-by-side table)")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each steady-load run")
    ap.add_argument("--backlog", type=int, default=20_000, help="requests preloaded to measure capacity")
    ap.add_argument("--quick", action="store_true", help="shorter runs, no static grid")
    ap.add_argument("--camera-text", action="store_true", help="also run the camera and text section")
    ap.add_argument("--overload-only", action="store_true", help="capacity + the overload scenarios only")
    ap.add_argument("--load-basis", choices=("live", "drained"), default="live",
                    help="what 100 %% load is: the live capacity, with the generator running and the broker "
                         "in the loop (default), or a drained backlog's (the old definition, an upper bound)")
    args = ap.parse_args()
    pool = RequestPool()
    engines = list(BROKERS) if args.broker == "both" else [args.broker]
    policies = [] if args.overload_only else STEADY_POLICIES
    reports = {}
    for engine in engines:
        report = reports[engine] = run_report(engine, args, pool)
        name = f"{'policies-overload' if args.overload_only else 'policies'}-{engine}"
        print(f"\n=== {engine} ===")
        print_tables(report, policies, LOADS, OVER_POLICIES)
        plot(report, policies, LOADS, OUT / f"{name}.png")
        (OUT / f"{name}.json").write_text(json.dumps(report, indent=2, default=float))
        print(f"\nplot: {OUT / (name + '.png')}\njson: {OUT / (name + '.json')}")
    if len(reports) > 1:
        print("\n=== side by side ===")
        print(side_by_side(reports, policies, LOADS, OVER_POLICIES))
    if args.camera_text:
        from bench import camera_text

        sys.argv = [sys.argv[0], *(["--quick"] if args.quick else [])]
        return camera_text.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
