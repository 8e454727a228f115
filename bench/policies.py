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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    BROKERS,
    OUT,
    RequestPool,
    cpu_shares,
    cpu_text,
    drain_throughput,
    fresh_topics,
    local_broker,
    open_loop,
    preload,
    read_request_ids,
    read_results,
    routed_rules,
    stages,
    stages_text,
    table,
    wait_outcomes,
    worker_process,
)

SLO_MS = 100.0


def policy_env(name: str, tuned: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    base = {"TIDEBATCH_BATCHING__SLO_MS": str(SLO_MS)}
    if name == "none":
        return "none", base
    if name == "static-64":
        return "static", {**base, "TIDEBATCH_BATCHING__MAX_BATCH_ROWS": "64", "TIDEBATCH_BATCHING__MAX_QUEUE_DELAY_MS": "10"}
    if name == "static-tuned":
        return "static", {**base, **(tuned or {})}
    if name == "greedy":
        return "greedy", base
    if name == "greedy-route":
        # Runs exactly greedy's code: admission sheds and the batcher routes only for a
        # policy with a late lane (pipeline/worker/core.py, `separates_late`), so this is
        # an A/A control, a second greedy row that shows the noise between two runs of one
        # configuration (docs/BATCHING.md, "Adaptive against greedy (item 4)").
        return "greedy", {**base, "TIDEBATCH_BATCHING__EXPIRY_ACTION": "route_late"}
    if name == "adaptive":
        return "adaptive", {**base, "TIDEBATCH_BATCHING__EXPIRY_ACTION": "route_late"}
    if name == "adaptive-noshed":
        # Adaptive without admission's reserve: only expired records are routed before
        # decoding (pipeline/batching/shed.py), the batcher's rules unchanged. What the
        # reserve costs or buys a row.
        return "adaptive", {**base, "TIDEBATCH_BATCHING__EXPIRY_ACTION": "route_late",
                            "TIDEBATCH_BATCHING__SHED_RESERVE": "0"}
    if name == "adaptive-score":
        return "adaptive", {**base, "TIDEBATCH_BATCHING__EXPIRY_ACTION": "score_late"}
    raise ValueError(name)


def high_priority(i: int) -> int:
    """The priorities scenario's split: about one request in five is high priority (0)."""
    return 0 if (i * 7919) % 10 < 2 else 1


def run_scenario(bs: str, pool: RequestPool, name: str, rate_fn, seconds: float, tuned=None,
                 priority_fn=None, extra_env: dict[str, str] | None = None, machine: bool = False,
                 trace: list | None = None, log_append: bool = False) -> dict:
    """One row: a fresh worker of policy `name` under the load rate_fn(t) for `seconds`.
    trace: gets the arrivals (harness.open_loop); the result's `_batches` holds the
    distinct (rows, model ms) of its batches, the points of its measured cost curve,
    and `_publish` each batch's (requests, ms from the publisher taking it to its last
    result's timestamp), the points of the publisher's cost per result. log_append: a
    LogAppendTime input topic (harness.fresh_topics), for the to_broker stage."""
    policy, env = policy_env(name, tuned)
    env = {**env, **(extra_env or {})}
    inp, out = fresh_topics(bs, f"bench-{name}", log_append=log_append)
    run = f"r{uuid.uuid4().hex[:6]}"
    with worker_process(bs, inp, out, policy, extra_env=env, log_name=f"policies-{name}") as proc:
        t0_ms = time.time() * 1000.0
        with cpu_shares(bs, proc.pid, machine=machine) as cores:
            sent = open_loop(bs, inp, pool, rate_fn, seconds, run, priority_fn=priority_fn, trace=trace)
        deadline = time.monotonic() + 120
        results = read_results(bs, out, sent, timeout=10, run=run)
        routed = read_request_ids(bs, f"{inp}.late", run, idle_timeout=1.0)
        while len(results.docs) + len(routed) < sent and time.monotonic() < deadline:
            results = read_results(bs, out, sent - len(routed), timeout=10, run=run)
            routed = read_request_ids(bs, f"{inp}.late", run, idle_timeout=1.0)
        breakdown = stages(proc)
        rules = routed_rules(proc)
    batches = sorted({(d["batch_rows"], d["inference_ms"]) for d in results.docs if "inference_ms" in d})
    return {**summarise(results, routed, sent, t0_ms, seconds), "cpu_cores": cores, "stages": breakdown,
            "routed_by_rule": rules, "_batches": batches, "_publish": publish_spans(results)}


def publish_spans(results) -> list[tuple[int, float]]:
    """Per batch (its results share `scored_at_ms`, when the publisher took it, and its
    rows and model time): its results and the ms from then to the last one's record
    timestamp, when the publisher handed it to the producer."""
    spans: dict[tuple, list] = {}
    for d, ts in zip(results.docs, results.result_ts_ms, strict=True):
        if "scored_at_ms" in d:
            key = (d["scored_at_ms"], d["batch_rows"], d.get("inference_ms"))
            n_last = spans.setdefault(key, [0, float(d["scored_at_ms"])])
            n_last[0] += 1
            n_last[1] = max(n_last[1], float(ts))
    return [(n, last - key[0]) for key, (n, last) in spans.items()]


def summarise(results, routed: set[str], sent: int, t0_ms: float, seconds: float) -> dict:
    lat = results.latency_ms if results.docs else np.array([0.0])
    in_slo = lat <= SLO_MS
    ts = np.array([d["kafka_ts_ms"] for d in results.docs], dtype=float) - t0_ms if results.docs else np.array([])
    prio = np.array([d.get("priority", 0) for d in results.docs]) if results.docs else np.array([])
    out = {
        "sent": sent,
        "scored_in_slo": int(in_slo.sum()),
        "scored_late": int((~in_slo).sum()) if results.docs else 0,
        "routed_late": len(routed),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "mean_batch_rows": float(np.mean([d["batch_rows"] for d in results.docs])) if results.docs else 0.0,
        "goodput_req_s": float(in_slo.sum()) / seconds,
        "_ts": ts, "_lat": lat, "_prio": prio,
    }
    out["outcomes_add_up"] = out["scored_in_slo"] + out["scored_late"] + out["routed_late"] == sent
    out["slo_miss_rate"] = 1.0 - out["scored_in_slo"] / max(sent, 1)
    return out


def window_goodput(r: dict, start_s: float, end_s: float) -> float:
    ts, lat = r["_ts"], r["_lat"]
    mask = (ts >= start_s * 1000) & (ts < end_s * 1000) & (lat <= SLO_MS)
    return float(mask.sum()) / (end_s - start_s)


def recovery_s(r: dict, burst_end_s: float, step: float = 0.5) -> float:
    """Time from the end of the burst until requests produced in a 0.5 s window are
    again answered within the SLO (99 % of them), and stay so for 2 s."""
    ts, lat = r["_ts"] / 1000.0, r["_lat"]
    t = burst_end_s
    horizon = ts.max() if len(ts) else burst_end_s
    while t < horizon:
        ok = True
        for k in range(4):
            m = (ts >= t + k * step) & (ts < t + (k + 1) * step)
            if m.sum() and (lat[m] <= SLO_MS).mean() < 0.99:
                ok = False
                break
        if ok:
            return t - burst_end_s
        t += step
    return float("inf")


def public(r: dict) -> dict:
    return {k: v for k, v in r.items() if not k.startswith("_")}


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


def kept_up(r: dict, seconds: float, within_ms: float = SLO_MS) -> bool:
    """Did the pipeline keep up with the offered load within the SLO? Every request
    answered, and the ones produced in the run's last third answered within the SLO at
    p99: below capacity latency stays flat through a run; above it a backlog grows and
    pushes the last third's latency up and up. The SLO, not a multiple of it: with 5
    SLOs allowed the bisection accepted a rate at which greedy's p99 was already 547 ms
    and at 90 % of which it collapsed in every repeat, so "50 %" and the burst's "0.8×
    capacity" were measured against a rate nobody serves in time (docs/BATCHING.md,
    "Adaptive against greedy for real")."""
    ts, lat = r["_ts"], r["_lat"]
    last = lat[ts >= seconds * 1000.0 * 2 / 3] if len(ts) else lat[:0]
    return bool(r["outcomes_add_up"] and len(last) and float(np.percentile(last, 99)) <= within_ms)


def live_capacity(bs: str, pool: RequestPool, drained: float, seconds: float, probes: int) -> tuple[float, list[dict]]:
    """The closed-loop capacity (issue 26): the highest request rate the worker keeps up
    with, within the SLO, while the generator runs and the broker is in the loop, by
    bisection between 0 and the drained capacity (a backlog drain has no generator and
    no live fetches, so it is an upper bound). Greedy scores everything (adaptive would
    route a backlog late). Each trial also says whether the backlog stayed within 5
    SLOs (`throughput_ok`, the rule before): throughput_capacity's figure."""
    lo, hi, trials = 0.0, drained, []
    for _ in range(probes):
        rate = (lo + hi) / 2
        r = run_scenario(bs, pool, "greedy", rate, seconds)
        ok = kept_up(r, seconds)
        trials.append({"rate_req_s": rate, "kept_up": ok, "throughput_ok": kept_up(r, seconds, 5 * SLO_MS),
                       "p99_ms": r["p99_ms"], "cpu_cores": r["cpu_cores"]})
        print(f"  live capacity probe {rate:7.0f} req/s: {'kept up' if ok else 'fell behind'} "
              f"(p99 {r['p99_ms']:.0f} ms; {cpu_text(r['cpu_cores'])})", flush=True)
        lo, hi = (rate, hi) if ok else (lo, rate)
    return (lo if lo > 0 else hi / 2), trials


def throughput_capacity(trials: list[dict], live: float) -> float:
    """The highest probed rate whose backlog stayed within 5 SLOs at p99 (every request
    answered): the rate the pipeline can process at all, above the rate it answers in
    time. The simulator's source thread costs 1 / this a request (bench/burst.py): it
    models the queueing that makes the two differ itself."""
    return max([t["rate_req_s"] for t in trials if t.get("throughput_ok")] + [live])


def measure_capacity(bs: str, pool: RequestPool, backlog: int, seconds: float, probes: int, engine: str) -> dict:
    """Both capacities on this broker: a drained backlog's (no generator, an upper
    bound) and the live one (live_capacity), printed as they are found."""
    inp, out = fresh_topics(bs, "bench-capacity")
    preload(bs, inp, pool, backlog, "cap")
    # A preloaded backlog is older than any SLO: lift it, or adaptive would rightly
    # route the whole backlog late instead of scoring it.
    env = {"TIDEBATCH_BATCHING__SLO_MS": "3600000"}
    with worker_process(bs, inp, out, "adaptive", extra_env=env, log_name="policies-capacity") as proc:
        wait_outcomes(proc, backlog)
        cap_res = read_results(bs, out, backlog, timeout=600, run="cap")
    drained, drained_rows = drain_throughput(cap_res)
    print(f"[{engine}] drained capacity (backlog, no generator): {drained:.0f} req/s ({drained_rows:.0f} rows/s)", flush=True)
    live, trials = live_capacity(bs, pool, drained, seconds, probes)
    print(f"[{engine}] live capacity (generator running, broker in the loop): {live:.0f} req/s, "
          f"{100 * live / drained:.0f} % of the drained one", flush=True)
    return {"drained_capacity_req_s": drained, "drained_capacity_rows_s": drained_rows,
            "live_capacity_req_s": live, "live_capacity_probes": trials,
            "throughput_capacity_req_s": throughput_capacity(trials, live)}


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
        print(side_by_side(reports, policies))
    if args.camera_text:
        from bench import camera_text

        sys.argv = [sys.argv[0], *(["--quick"] if args.quick else [])]
        return camera_text.main()
    return 0


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _cell(r: dict) -> str:
    return f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ({100 * r['slo_miss_rate']:.0f}%)"


def side_by_side(reports: dict[str, dict], policies: list[str]) -> str:
    """One row per policy and load, one column per broker: p50 / p99 ms (SLO-miss %);
    then goodput under overload, and the cores each process used at 50 % load."""
    engines = list(reports)
    rows = [["capacity, req/s: drained / live", *(f"{reports[e]['drained_capacity_req_s']:.0f} / {reports[e]['live_capacity_req_s']:.0f}"
                                                 for e in engines)],
            ["loads are of", *(reports[e]["load_basis"] for e in engines)]]
    for p in policies:
        for k in [str(x) for x in LOADS] + ["onoff"]:
            what = "on/off bursts" if k == "onoff" else f"{100 * float(k):.0f}%"
            rows.append([f"{p}, {what}", *(_cell(reports[e]["steady"][p][k]) for e in engines)])
    for p in OVER_POLICIES:
        rows.append([f"{p}, burst / 120% goodput (x capacity)",
                     *(f"{reports[e]['overload'][p]['burst']['burst_goodput_x_capacity']:.2f} / "
                       f"{reports[e]['overload'][p]['overload']['goodput_x_capacity']:.2f}" for e in engines)])
    for p in policies:
        rows.append([f"{p}, 50%: stage p99 ms to_worker / decode / queue / model / publish",
                     *(" / ".join(_ms(reports[e]["steady"][p]["0.5"]["stages"][k]["p99_ms"])
                                 for k in ("to_worker", "decode", "queue", "model", "publish")) for e in engines)])
    for p in policies:
        rows.append([f"{p}, 50%: cores generator / worker / broker",
                     *("{generator:.2f} / {worker:.2f} / {broker:.2f}".format(**reports[e]["steady"][p]["0.5"]["cpu_cores"])
                       for e in engines)])
    return table(["case", *engines], rows)


def print_tables(report: dict, policies: list[str], loads: list[float], over_policies: list[str]) -> None:
    cap = report["capacity_req_s"]
    print(f"\ncapacity: drained {report['drained_capacity_req_s']:.0f} req/s, live {report['live_capacity_req_s']:.0f} req/s; "
          f"loads are of the {report['load_basis']} one")
    print(f"capacity {cap:.0f} req/s ({report['capacity_rows_s']:.0f} rows/s); SLO {SLO_MS:.0f} ms; "
          f"static-tuned = {report['static_tuned']}")
    rows = []
    for p in policies:  # empty with --overload-only
        row = [p]
        for k in [str(x) for x in loads] + ["onoff"]:
            r = report["steady"][p][k]
            row.append(f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ({100 * r['slo_miss_rate']:.0f}%)")
        rows.append(row)
    if rows:
        print("\np50 / p99 ms (SLO-miss %) by load")
        print(table(["policy", "10%", "50%", "90%", "on/off bursts"], rows))
    rows = []
    for p in over_policies:
        b, o, pr = (report["overload"][p][k] for k in ("burst", "overload", "priorities"))
        rows.append([
            p, f"{b['burst_goodput_x_capacity']:.2f}", f"{b['recovery_s']:.1f}",
            f"{o['goodput_x_capacity']:.2f}", f"{pr['high_p99_ms']:.0f}", f"{pr['low_p99_ms']:.0f}",
            "yes" if all(x["outcomes_add_up"] for x in (b, o, pr)) else "NO",
        ])
    print("\noverload scenarios (goodput = answers within SLO per second, x capacity)")
    print(table(["policy", "burst goodput", "recovery s", "120% goodput", "hi-prio p99 @110%",
                 "lo-prio p99", "outcomes add up"], rows))


def plot(report: dict, policies: list[str], loads: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    xs = [100 * x for x in loads]
    for p in policies:
        (line,) = axes[0].plot(xs, [report["steady"][p][str(x)]["p99_ms"] for x in loads], marker="o", label=p)
        axes[0].plot(xs, [report["steady"][p][str(x)]["p50_ms"] for x in loads], ls=":", color=line.get_color())
        axes[1].plot(xs, [100 * report["steady"][p][str(x)]["slo_miss_rate"] for x in loads], marker="o",
                     color=line.get_color(), label=p)
    axes[0].axhline(SLO_MS, color="k", ls="--", lw=0.8, label="SLO")
    axes[0].set(yscale="log", xlabel="load (% of capacity)", ylabel="latency of scored requests, ms",
                title="latency: p99 (solid), p50 (dotted)")
    axes[0].legend(fontsize=7)
    axes[1].set(xlabel="load (% of capacity)", ylabel="% of requests not answered within SLO",
                title="SLO misses (scored late or routed late)")
    axes[1].legend(fontsize=7)
    over = report["overload"]
    names = list(over)
    x = np.arange(len(names))
    axes[2].bar(x - 0.2, [over[n]["burst"]["burst_goodput_x_capacity"] for n in names], 0.4, label="burst 150%")
    axes[2].bar(x + 0.2, [over[n]["overload"]["goodput_x_capacity"] for n in names], 0.4, label="sustained 120%")
    axes[2].set_xticks(x, names, fontsize=8)
    axes[2].set(ylabel="goodput (x capacity)", title="goodput under overload")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
