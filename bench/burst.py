"""Steady, burst, overload and priority rows of bench/policies.py for a few policies,
repeated and interleaved, optionally against a baseline checkout, in one run on one
broker (issue 26, items 4 and 5):

    .venv/bin/python bench/burst.py --policies greedy,adaptive --repeat 3 \\
        --scenarios steady:0.1,steady:0.5,steady:0.9,burst,overload,priorities [--broker tansu]
    .venv/bin/python bench/burst.py --capacity 700 --scenarios burst --baseline /tmp/tidebatch-before

Without --capacity, 100 % load is the live capacity measured first in the same run
(bench/policies_capacity.py's measure_capacity: a drained backlog, then greedy probes with the
generator running and the broker in the loop); --capacity R skips that. --baseline DIR
runs the same rows with workers started from DIR (a checkout of another commit), each
row right after this tree's, so the two are compared under the same machine load.
Every row prints the cores of the generator (this process), the worker, the broker and
the rest of the machine meanwhile, and is appended to out/bench/burst.jsonl.

At the end, per scenario, the medians over the repeats: adaptive against greedy (item
4: p99 at most 1.05x, goodput at least 0.95x), and the simulator's prediction of every
row against the measurement (item 5, bench/calibration.py): the row's recorded
arrivals replayed on the cost curve and noise fitted to this run's batches, with the
Kafka hop of the row (a steady one) or of the lowest-load rows, and a source thread
costing 1 / the throughput capacity a request (the highest probed rate whose backlog
stayed within 5 SLOs; with --capacity, 1 / capacity), and a publisher costing the
run's µs per result (bench/calibration.py publish_us). Traces, the curve and the
report go to out/bench/burst-BROKER/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench import calibration, harness  # noqa: E402
from bench.ctr_codec import best_of  # noqa: E402
from bench.harness import OUT, RequestPool, cpu_text, local_broker, rules_text, stages_text  # noqa: E402
from bench.policies_capacity import measure_capacity  # noqa: E402
from bench.policies_scenario import SLO_MS, high_priority, run_scenario, window_goodput  # noqa: E402
from pipeline.simulate.trace import read_trace  # noqa: E402

PRE, BURST, POST = 3.0, 6.0, 6.0
STEADY_SECONDS = 6.0
# A row's measured points (run_scenario's `_batches` and `_publish`): kept in memory for
# the run's curve and publisher fits, left out of burst.jsonl and report.json.
POINTS = ("_batches", "_publish")


@contextmanager
def workers_from(repo: Path | None):
    """Start the workers of the block from `repo` (None: this tree)."""
    if repo is None:
        yield
        return
    saved = harness.REPO
    harness.REPO = repo
    try:
        yield
    finally:
        harness.REPO = saved


def row(bs: str, pool: RequestPool, policy: str, scenario: str, capacity: float, repo: Path | None,
        trace: list | None = None, log_append: bool = False) -> dict:
    env = {"PYTHONPATH": str(repo)} if repo is not None else {}
    common = {"extra_env": env, "machine": True, "trace": trace, "log_append": log_append}
    with workers_from(repo):
        if scenario == "burst":
            def rate(t: float) -> float:
                return (1.5 if PRE <= t < PRE + BURST else 0.5) * capacity

            r = run_scenario(bs, pool, policy, rate, PRE + BURST + POST, **common)
            r["goodput_x_capacity"] = window_goodput(r, PRE, PRE + BURST) / capacity
        elif scenario == "overload":
            r = run_scenario(bs, pool, policy, 1.2 * capacity, STEADY_SECONDS, **common)
            r["goodput_x_capacity"] = window_goodput(r, 2.0, STEADY_SECONDS) / capacity
        elif scenario == "priorities":
            r = run_scenario(bs, pool, policy, 1.1 * capacity, STEADY_SECONDS, priority_fn=high_priority, **common)
            r["goodput_x_capacity"] = window_goodput(r, 2.0, STEADY_SECONDS) / capacity
            hi = r["_prio"] == 0
            r["high_p99_ms"] = float(np.percentile(r["_lat"][hi], 99)) if hi.any() else float("nan")
        else:  # steady:FRACTION
            load = float(scenario.split(":", 1)[1])
            r = run_scenario(bs, pool, policy, load * capacity, STEADY_SECONDS, **common)
            r["goodput_x_capacity"] = window_goodput(r, 0.0, STEADY_SECONDS) / capacity
    return {k: v for k, v in r.items() if not k.startswith("_") or k in POINTS}


def summary(path: Path, since: float = 0.0) -> str:
    """The rows of burst.jsonl since a time, by scenario, policy and tree: runs,
    goodput (x capacity) median and range, p99 range, and the cores of the generator and
    of the rest of the machine over those runs."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["at"] >= since:
            groups.setdefault((r["scenario"], r["policy"], r["tree"]), []).append(r)
    rows = []
    for (scenario, policy, tree), rs in sorted(groups.items()):
        good = sorted(r["goodput_x_capacity"] for r in rs)
        p99 = [r["p99_ms"] for r in rs]
        gen = [r["cpu_cores"]["generator"] for r in rs]
        others = [r["cpu_cores"].get("others", float("nan")) for r in rs]
        rules: dict[str, int] = {}
        for r in rs:
            for rule, n in (r.get("routed_by_rule") or {}).items():
                rules[rule] = rules.get(rule, 0) + n
        rows.append([scenario, policy, tree, len(rs), f"{good[len(good) // 2]:.2f} ({good[0]:.2f}-{good[-1]:.2f})",
                     f"{min(p99):.0f}-{max(p99):.0f}", f"{min(gen):.2f}-{max(gen):.2f}",
                     f"{min(others):.2f}-{max(others):.2f}", rules_text(rules) or "-"])
    return harness.table(["scenario", "policy", "tree", "runs", "goodput x cap: median (range)", "p99 ms",
                          "generator cores", "other cores", "routed, all runs, by rule"], rows)


def decode_us(pool: RequestPool, poll: int = 1000) -> float:
    """The CTR codec's thread-CPU microseconds per request, decoding the pool's
    requests a poll at a time as the worker's source thread does (best of 5)."""
    from pipeline.codecs.ctr import CtrCodec

    codec = CtrCodec()
    msgs = [(pool.get(i, "calibrate")[1], None) for i in range(len(pool.rows))]

    def decode_all() -> None:
        for at in range(0, len(msgs), poll):
            codec.decode_many(msgs[at : at + poll])

    return best_of(decode_all, clock=time.thread_time) / len(msgs) * 1e6


def medians(rows: list[dict]) -> dict:
    """One scenario and policy over its repeats: medians of p50, p99, goodput (x
    capacity) and in-SLO share, with the ranges of p99 and goodput."""
    def med(key: str) -> float:
        return float(np.median([r[key] for r in rows]))

    return {"runs": len(rows), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"), "goodput": med("goodput_x_capacity"),
            "in_slo_share": float(np.median([r["scored_in_slo"] / max(r["sent"], 1) for r in rows])),
            "p99_range": (min(r["p99_ms"] for r in rows), max(r["p99_ms"] for r in rows)),
            "goodput_range": (min(r["goodput_x_capacity"] for r in rows), max(r["goodput_x_capacity"] for r in rows))}


def report_tables(kept: list[dict], capacity: float, curve: dict, broker: str, source_capacity: float = 0.0,
                  publish: float = 0.0) -> dict:
    """Item 4 (adaptive against greedy, per scenario) and item 5 (the simulator's
    prediction of every row), printed and returned. The simulator's source thread
    costs 1 / source_capacity per request (default: capacity): the one figure fitted,
    to the rate the pipeline processes at all (bench/policies_capacity.py throughput_capacity;
    the worker's source thread, sharing two cores with the broker and the generator, is
    what saturates, docs/BATCHING.md); the codec's own decode cost is printed beside
    it. `publish`: the publisher's µs per result, fitted to the run's batches
    (calibration.publish_us; 0: answered when the model ends)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in kept:
        if r["tree"] == "this":
            groups.setdefault((r["scenario"], r["policy"]), []).append(r)
    med = {k: medians(v) for k, v in groups.items()}
    scenarios = list(dict.fromkeys(s for s, _ in groups))
    lines, verdicts = [], {}
    for sc in scenarios:
        g, a = med.get((sc, "greedy")), med.get((sc, "adaptive"))
        if g is None or a is None:
            continue
        ratios = calibration.paired(groups[(sc, "greedy")], groups[(sc, "adaptive")])
        ok, why = calibration.verdict(ratios)
        verdicts[sc] = {"ok": ok, "why": why, **ratios}
        lines.append([sc, f"{g['runs']}", f"{g['p99_ms']:.0f} ({g['p99_range'][0]:.0f}-{g['p99_range'][1]:.0f})",
                      f"{a['p99_ms']:.0f} ({a['p99_range'][0]:.0f}-{a['p99_range'][1]:.0f})",
                      f"{g['goodput']:.2f} ({g['goodput_range'][0]:.2f}-{g['goodput_range'][1]:.2f})",
                      f"{a['goodput']:.2f} ({a['goodput_range'][0]:.2f}-{a['goodput_range'][1]:.2f})",
                      why, "yes" if ok else "NO"])
    print(f"\n[{broker}] adaptive against greedy: medians over the repeats (range); goodput x capacity "
          f"({capacity:.0f} req/s); adaptive over greedy repeat by repeat, median (range)")
    print(harness.table(["scenario", "runs", "greedy p99 ms", "adaptive p99 ms", "greedy goodput",
                         "adaptive goodput", "adaptive over greedy, paired", "holds"], lines))
    # Item 5: the simulator on each row's own arrivals.
    steady = sorted((r for r in kept if r["scenario"].startswith("steady:")), key=lambda r: r["scenario"])
    low = [r for r in steady if r["scenario"] == steady[0]["scenario"]] if steady else kept
    hop = calibration.hop_of([r["stages"] for r in low])
    dec = 1e6 / (source_capacity or capacity)
    print(f"\n[{broker}] simulator against the pipeline: curve fitted to {curve['source']} (noise sigma "
          f"{curve.get('noise_sigma', 0.1):.2f}); Kafka hop "
          f"p50/p99 {hop[0]:.1f}/{hop[1]:.1f} ms (to_worker of {low[0]['scenario'] if low else '-'} rows); "
          f"source {dec:.0f} us/request (1 / {source_capacity or capacity:.0f} req/s; the codec alone: {decode_us(RequestPool()):.0f}); "
          f"publisher {publish:.0f} us/result")
    pred: dict[tuple[str, str], list[dict]] = {}
    for r in kept:
        if r["tree"] != "this" or r["policy"] not in ("greedy", "adaptive"):
            continue  # a baseline's row, or a variant the simulator has no model of (greedy-route)
        # A steady row's own to_worker is its hop: on two shared cores the broker's and
        # the consumer's delay grows with the load (p99 12 ms at 10 %, 22-46 at 50 %),
        # and below capacity no backlog the simulator would model twice is in it.
        own = calibration.hop_of([r["stages"]]) if r["scenario"].startswith("steady:") else hop
        p = calibration.predict(read_trace(r["trace"]), curve, r["policy"], hop_ms=own, decode_us=dec,
                                seed=r["rep"] + 1, publish_us=publish)
        pred.setdefault((r["scenario"], r["policy"]), []).append(p)
    lines, calib = [], {}
    for (sc, pol), ps in pred.items():
        m = med[(sc, pol)]
        pm = {k: float(np.median([p[k] for p in ps])) for k in ("p50_ms", "p99_ms", "in_slo_share")}
        checks = [calibration.within(pm[k], m[k]) for k in ("p50_ms", "p99_ms", "in_slo_share")]
        calib[f"{sc} {pol}"] = {"measured": {k: m[k] for k in ("p50_ms", "p99_ms", "in_slo_share")}, "predicted": pm,
                                "within_30pct": checks}
        lines.append([sc, pol, f"{m['p50_ms']:.0f} / {pm['p50_ms']:.0f}", f"{m['p99_ms']:.0f} / {pm['p99_ms']:.0f}",
                      f"{m['in_slo_share']:.3f} / {pm['in_slo_share']:.3f}",
                      " ".join("ok" if c else "off" for c in checks)])
    print(harness.table(["scenario", "policy", "p50 ms measured / predicted", "p99 ms", "in-SLO share",
                         "within 30 %: p50 p99 share"], lines))
    order = {}
    for sc in scenarios:
        if (sc, "greedy") in pred and (sc, "adaptive") in pred:
            # Ahead or tied within 1 %: at 10 % load both answer all but a request or two.
            real = med[(sc, "adaptive")]["goodput"] >= 0.99 * med[(sc, "greedy")]["goodput"]
            sim = (np.median([p["in_slo_share"] for p in pred[(sc, "adaptive")]])
                   >= 0.99 * np.median([p["in_slo_share"] for p in pred[(sc, "greedy")]]))
            order[sc] = {"measured_adaptive_ahead": bool(real), "predicted_adaptive_ahead": bool(sim)}
    print("policy order by goodput, measured / predicted (adaptive >= 0.99 x greedy): " + ", ".join(
        f"{sc} {'yes' if o['measured_adaptive_ahead'] else 'no'}/{'yes' if o['predicted_adaptive_ahead'] else 'no'}"
        for sc, o in order.items()))
    first = next((r for r in kept if r["tree"] == "this"), None)
    if first is not None:
        print(f"one row by hand: tidebatch simulate --scenario trace:{first['trace']} --curve {curve.get('path', 'CURVE.json')} "
              f"--hop-ms {hop[0]:.1f}:{hop[1]:.1f} --decode-us {dec:.0f} --publish-us {publish:.0f} "
              f"--noise {curve.get('noise_sigma', 0.1):.2f} "
              f"--policies {first['policy']} --json")
    return {"verdicts": verdicts, "medians": {f"{k[0]} {k[1]}": v for k, v in med.items()}, "calibration": calib,
            "order": order, "curve": curve, "hop_ms": hop, "decode_us": dec, "publish_us": publish}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=float, default=0.0,
                    help="100 %% load, req/s (default: the live capacity, measured first in the same run)")
    ap.add_argument("--backlog", type=int, default=10_000, help="requests preloaded for the drained capacity")
    ap.add_argument("--probes", type=int, default=4, help="live-capacity probes (bisection)")
    ap.add_argument("--policies", default="greedy,adaptive")
    ap.add_argument("--scenarios", default="burst",
                    help="steady:0.5, burst, overload, priorities, ... (comma-separated)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--broker", choices=harness.BROKERS, default="kafka")
    ap.add_argument("--baseline", type=Path, help="a checkout whose workers run each row again, for comparison")
    ap.add_argument("--baseline-policies", default=None,
                    help="the policies the baseline runs (default: all; a policy whose code did not change "
                         "need not run twice)")
    ap.add_argument("--summary", type=float, metavar="SINCE", default=None,
                    help="print the table of out/bench/burst.jsonl's rows since this Unix time and exit")
    ap.add_argument("--log-append-time", action="store_true",
                    help="input topics stamp the broker's append time (Apache Kafka only): the stage lines gain "
                         "to_broker (produce call to append), and latency and deadlines count from the append")
    ap.add_argument("--from-report", type=Path, metavar="REPORT",
                    help="print the comparison and calibration tables again from a run's report.json and exit")
    args = ap.parse_args()
    if args.log_append_time and args.broker == "tansu":
        ap.error("--log-append-time needs Apache Kafka: Tansu stores the setting and keeps CreateTime (docs/BROKERS.md)")
    if args.summary is not None:
        print(summary(OUT / "burst.jsonl", args.summary))
        return 0
    if args.from_report is not None:
        old = json.loads(args.from_report.read_text())
        report_tables(old["rows"], old["capacity_req_s"], old["curve"], old["broker"],
                      old.get("throughput_capacity_req_s", 0.0), old.get("publish_us", 0.0))
        return 0
    pool = RequestPool()
    trees = [("this", None)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    again = set((args.baseline_policies or args.policies).split(","))
    out_dir = OUT / f"burst-{args.broker}"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report: dict = {"broker": args.broker, "started": started, "argv": sys.argv[1:], "slo_ms": SLO_MS}
    kept: list[dict] = []
    with local_broker(args.broker) as broker, open(OUT / "burst.jsonl", "a") as log:
        capacity = args.capacity
        if capacity <= 0:
            report.update(measure_capacity(broker.bootstrap_servers, pool, args.backlog, STEADY_SECONDS, args.probes,
                                           args.broker))
            capacity = report["live_capacity_req_s"]
        report["capacity_req_s"] = capacity
        # The first row on a fresh broker ran with it still warming up: its to_worker p99
        # was twice the next row's and it routed 10-40x as many requests (whichever tree
        # ran it, issue 26): a row not kept, first.
        warm = row(broker.bootstrap_servers, pool, args.policies.split(",")[0], "steady:0.5", capacity, None)
        print(f"warm-up row (not kept): in-slo {warm['scored_in_slo']}/{warm['sent']}", flush=True)
        for rep in range(args.repeat):
            for scenario in args.scenarios.split(","):
                # Policies take turns going first too: within a scenario the second row
                # runs on a broker that has just taken the first's load.
                policies = args.policies.split(",")
                for policy in (policies if rep % 2 == 0 else policies[::-1]):
                    # Trees take turns going first, so neither gains from an order effect.
                    for tree, repo in (trees if rep % 2 == 0 else trees[::-1]):
                        if tree == "baseline" and policy not in again:
                            continue
                        trace: list = []
                        r = row(broker.bootstrap_servers, pool, policy, scenario, capacity, repo, trace,
                                args.log_append_time)
                        path = out_dir / f"trace-{scenario.replace(':', '')}-{policy}-{tree}-{rep}.jsonl"
                        calibration.write_trace(path, trace)
                        print(f"{scenario:10s} {policy:9s} {tree:8s} goodput {r['goodput_x_capacity']:.2f}x "
                              f"in-slo {r['scored_in_slo']}/{r['sent']} late {r['scored_late']} routed "
                              f"{r['routed_late']} {rules_text(r.get('routed_by_rule'))} "
                              f"p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} ms; "
                              f"{cpu_text(r['cpu_cores'])}; {stages_text(r['stages'])}", flush=True)
                        entry = {"at": time.time(), "rep": rep, "scenario": scenario, "policy": policy, "tree": tree,
                                 "capacity": capacity, "broker": args.broker, "trace": str(path), **r}
                        kept.append(entry)
                        log.write(json.dumps({k: v for k, v in entry.items() if k not in POINTS}, default=float) + "\n")
                        log.flush()
    print("\n" + summary(OUT / "burst.jsonl", started))
    curve = calibration.fit_curve([tuple(b) for r in kept for b in r["_batches"]], SLO_MS)
    curve["path"] = str(out_dir / "curve.json")
    Path(curve["path"]).write_text(json.dumps(curve, indent=1))
    report["publish_us"] = calibration.publish_us([p for r in kept if r["tree"] == "this" for p in r["_publish"]])
    report.update(report_tables(kept, capacity, curve, args.broker, report.get("throughput_capacity_req_s", 0.0),
                                report["publish_us"]))
    report["rows"] = [{k: v for k, v in r.items() if k not in POINTS} for r in kept]
    (out_dir / "report.json").write_text(json.dumps(report, indent=1, default=float))
    print(f"\nreport: {out_dir / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
