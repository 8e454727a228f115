"""Issue 23, part 1: tidebatch and what users would write instead, the same job side by
side — `ctr.requests` → one result per request on `ctr.scores` — with the same model
file and ONNX Runtime settings, the same requests, the same broker, on this machine.
The rows are in bench/peers/launch.py, the peers' code beside it, docs/PEERS.md reads
the result.

1. the model's direct peak (bench/model_peak.py: ORT alone, 1 thread, fresh request
   rows), the denominator of every "of peak" share;
2. drains: the same N CTR requests (JSON, and binary for the rows that say so)
   preloaded on 4 partitions of a fresh topic per drain, rounds interleaved, medians;
   throughput, CPU-seconds per 10k requests of the peer's process and of the broker's
   separately, and correctness (every request scored once, scores within 1e-6 of the
   model's own);
3. live (--part live): p50/p99 and SLO goodput (100 ms) at paced loads of 25/50/75 %
   of the slowest peer's drained capacity and of tidebatch's, with every value
   encoded before the clock starts; the generator's CPU share is printed.

    .venv/bin/python bench/peers.py [--broker kafka|embedded] [--requests 10000] [--rounds 3]
        [--part drain|live|all] [--only loop-64,tidebatch-static] [--quick] [--report]

Results are merged into out/bench/peers-BROKER.json (one file per broker and commit
of the measured code: a run on another starts it afresh), so the rows can be measured in several
turns (--only) and printed together (--report, which also draws the plot and writes
the CSV). bench/peers/run_all.sh is the whole run in one command. quixstreams and
Bytewax rows need .venv-peers (bench/peers/setup.sh) and are skipped without it.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import _BROKER_PIDS as BROKER_PIDS  # noqa: E402
from bench.harness import OUT, REPO, RequestPool, local_broker  # noqa: E402
from bench.peers import report  # noqa: E402
from bench.peers.launch import DEFAULT, PEERS  # noqa: E402
from bench.peers.measure import drain, live, reference_scores  # noqa: E402

LOADS = (0.25, 0.5, 0.75)


# What the figures depend on: the code under test, the peers and how they are timed.
# A commit that changes only docs, tests, or how results are merged and printed
# (this file, bench/peers/report.py) keeps the results of the turns measured before it.
MEASURED = ["pipeline", "consumers", "models", "examples/faust_ctr/app.py", "pyproject.toml", "bench/harness.py",
            "bench/model_peak.py", "bench/peers/common.py", "bench/peers/launch.py", "bench/peers/measure.py",
            "bench/peers/plain_loop.py", "bench/peers/quix_app.py", "bench/peers/bytewax_flow.py",
            "bench/peers/faust_take.py"]


def commit() -> str:
    """The last commit of the measured code, "-dirty" when it has changes not committed."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *MEASURED)
    return git("log", "-1", "--format=%h", "--", *MEASURED) + ("-dirty" if dirty else "")


def load_results(path: Path, broker: str) -> dict:
    """The merged results so far, if they are of this commit and broker; else empty."""
    here = commit()
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("commit") == here and data.get("broker") == broker:
            return data
        print(f"{path}: results of {data.get('commit')} on {data.get('broker')}; starting afresh", flush=True)
    return {"commit": here, "broker": broker, "model_peak": [], "drain": {}, "live": {}}


def model_peak() -> dict:
    from bench.model_peak import measure

    peak = measure("ctr", [128, 256, 512, 1024], threads=1, provider="cpu", seconds=1.0, feeds="requests")
    return {"rows_per_s": peak["best"]["rows_per_s"], "batch": peak["best"]["batch"]}


def run_drains(results: dict, rows: list[tuple[str, str]], args: argparse.Namespace, bootstrap: str,
               pools: dict[str, RequestPool], refs: dict[str, list[list[float]]], save: Callable[[], None]) -> None:
    for k in range(args.rounds):  # interleaved: every row sees the machine's drift alike
        for name, enc in rows:
            r = drain(PEERS[name], bootstrap, pools[enc], args.requests, refs[enc], BROKER_PIDS[bootstrap], f"{enc}-{k}")
            if "failed" in r:
                print(f"drain {name} {enc} round {k + 1} failed: {r['failed']}", flush=True)
                results.setdefault("failed", {})[f"{name}:{enc}"] = r["failed"]
                continue
            results["drain"].setdefault(f"{name}:{enc}", []).append(r)
            save()  # a turn cut short by its time limit keeps what it measured
            print(f"drain {name} {enc} round {k + 1}: {r['rows_per_s']:.0f} rows/s, {r['requests_per_s']:.0f} req/s, "
                  f"cpu/10k worker {r['worker_cpu_s_per_10k']:.1f} s broker {r['broker_cpu_s_per_10k']:.1f} s, "
                  f"scored {r['scored']}/{r['sent']} dup {r['duplicates']} diff {r['max_abs_diff']:.1e}", flush=True)


def live_rates(results: dict, fractions: tuple[float, ...]) -> dict[str, float]:
    """label → req/s: fractions of the slowest row's and of tidebatch's median drain
    (JSON requests, from the drains merged so far)."""
    med = report.json_drain_medians(results)
    if not med:
        raise SystemExit("no JSON drains yet: run --part drain first (the loads are fractions of their capacities)")
    slowest = min(med, key=med.get)  # type: ignore[arg-type]
    tide = max((v for k, v in med.items() if k.startswith("tidebatch-")), default=None)
    rates = {f"{int(f * 100)}% of slowest ({slowest.split(':')[0]})": f * med[slowest] for f in fractions}
    if tide is not None and tide != med[slowest]:
        rates.update({f"{int(f * 100)}% of tidebatch": f * tide for f in fractions})
    return rates


def run_live(results: dict, names: list[str], args: argparse.Namespace, bootstrap: str, pool: RequestPool,
             ref: list[list[float]], save: Callable[[], None]) -> None:
    rates = live_rates(results, args.loads)
    results["live_rates"] = rates
    for label, rate in rates.items():
        for name in names:
            r = live(PEERS[name], bootstrap, pool, rate, args.seconds, ref, BROKER_PIDS[bootstrap], "json")
            results["live"].setdefault(name, {})[label] = r
            save()
            cores = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores"].items())
            print(f"live {name} @ {label} = {rate:.0f} req/s: p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} ms, "
                  f"goodput {r['goodput_req_s']:.0f} req/s ({100 * r['in_slo']:.0f}% in SLO), "
                  f"scored {r['scored']}/{r['sent']}; cores: {cores}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--join-delay-ms", type=int, default=3000,
                    help="Apache Kafka's group.initial.rebalance.delay.ms (its default 3000)")
    ap.add_argument("--broker", choices=("kafka", "embedded", "tansu"), default="kafka",
                    help="Apache Kafka, one local node (default), or the embedded Tansu broker")
    ap.add_argument("--requests", type=int, default=10_000, help="requests per drain")
    ap.add_argument("--rounds", type=int, default=3, help="drains per row (the median is reported)")
    ap.add_argument("--part", choices=("drain", "live", "all"), default="drain")
    ap.add_argument("--only", default="", help=f"rows, comma-separated (default: {','.join(DEFAULT)})")
    ap.add_argument("--encodings", default="json,binary", help="request forms to drain, where a row has them")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each live run")
    ap.add_argument("--loads", default=",".join(str(x) for x in LOADS), help="live loads, fractions of capacity")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 200 requests, 1 round, 3 s live runs at 25 %%")
    ap.add_argument("--skip-done", action="store_true", help="leave out rows the merged results already have")
    ap.add_argument("--report", action="store_true", help="print, plot and write CSV from the merged results only")
    ap.add_argument("--results", type=Path, default=None, help="the merged results file (default out/bench/peers-BROKER.json)")
    args = ap.parse_args()
    engine = "tansu" if args.broker == "embedded" else args.broker
    args.loads = tuple(float(x) for x in args.loads.split(",") if x)
    if args.quick:
        args.requests, args.rounds, args.seconds, args.loads = 200, 1, 3.0, (0.25,)
    path = args.results or OUT / f"peers-{engine}.json"
    OUT.mkdir(parents=True, exist_ok=True)
    if args.report:  # the results as measured, whichever commit they are of (printed with them)
        results = json.loads(path.read_text())
        print(report.text(results))
        print("\n" + report.markdown(results))
        report.write(results, path.with_suffix(""))
        return 0
    results = load_results(path, engine)
    names = [n for n in (args.only.split(",") if args.only else DEFAULT) if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        ap.error(f"unknown rows {unknown}; use {','.join(PEERS)}")
    for n in [n for n in names if not PEERS[n].available()]:
        print(f"{n}: skipped, .venv-peers is absent (bench/peers/setup.sh makes it)", flush=True)
        results.setdefault("skipped", {})[n] = "no .venv-peers"
    names = [n for n in names if PEERS[n].available()]
    if args.skip_done:  # a rerun after an interrupted turn: what is merged already stays
        names = [n for n in names if args.part == "live" and n not in results["live"]
                 or args.part != "live" and len(results["drain"].get(f"{n}:json", [])) < args.rounds]
    if not names:
        print("no rows left to measure", flush=True)
        return 0
    encodings = [e for e in args.encodings.split(",") if e]
    pools = {e: RequestPool(encoding=e) for e in encodings}
    refs = {e: reference_scores(pools[e]) for e in encodings}
    def save() -> None:
        path.write_text(json.dumps(results, indent=1, default=float))

    # `timeout` (bench/peers/run_all.sh) sends SIGTERM: unwind, so that the peer's
    # process and the broker are stopped by their context managers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Apache Kafka's own group.initial.rebalance.delay.ms (3 s; the tests' broker sets 0):
    # a `--processes 2` row started on its backlog then settles before it drains, as a
    # production group does, instead of one child draining alone until the other joins.
    # The other rows only start 3 s later (a drain is timed from its first result).
    with local_broker(engine, {"group.initial.rebalance.delay.ms": str(args.join_delay_ms)}) as broker:
        bootstrap = broker.bootstrap_servers
        if args.part in ("drain", "all"):
            results["model_peak"].append(model_peak())
            print(f"model peak: {results['model_peak'][-1]['rows_per_s']:.0f} rows/s", flush=True)
            rows = [(n, e) for n in names for e in encodings if e in PEERS[n].encodings]
            run_drains(results, rows, args, bootstrap, pools, refs, save)
        if args.part in ("live", "all"):
            run_live(results, names, args, bootstrap, pools["json"], refs["json"], save)
    print(report.text(results))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
