"""Issue 23, part 1: bench/policies.py's burst scenario for the rows of bench/peers.py.

Every row gets the same open-loop Poisson load of JSON CTR requests, every value
encoded before the clock starts: 50 % of a capacity C for 3 s, 150 % of C for 10 s,
50 % of C for 10 s (bench/policies.py's burst). Per row: the burst's goodput (the
requests produced during the burst and answered within the 100 ms SLO, per second,
over C), the recovery time after it (bench/policies_scenario.py `recovery_s`: until 99 % of a
0.5 s window's requests are answered in time, for 2 s), p50/p99 and the share in SLO
over the whole run, correctness as in bench/peers/measure.py, and the cores the
generator (this process), the peer and the broker used meanwhile.

C is the one load basis all rows share: `--capacity`, else the live capacity measured
in the same run as bench/policies.py measures it (greedy tidebatch kept up within the
SLO, bisected between 0 and tidebatch's median JSON drain in out/bench/peers-BROKER.json,
which bench/peers.py's drains write).

    .venv/bin/python bench/peers_burst.py [--broker kafka] [--only loop-64,tidebatch-adaptive] [--repeat 1]

Results: out/bench/peers-burst-BROKER.json (a file of its own: the drains' and live
loads' file, bench/peers.py, is not touched).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import _BROKER_PIDS as BROKER_PIDS  # noqa: E402
from bench.harness import OUT, RequestPool, cpu_text, local_broker  # noqa: E402
from bench.peers import report  # noqa: E402
from bench.peers.launch import PEERS, Peer  # noqa: E402
from bench.peers.measure import SLO_MS, correctness, reference_scores, scheduled_run  # noqa: E402
from bench.policies_capacity import live_capacity  # noqa: E402
from bench.policies_scenario import recovery_s, window_goodput  # noqa: E402
from pipeline.loadgen.pacing import poisson_schedule  # noqa: E402

ROWS = ["tidebatch-adaptive", "tidebatch-static", "loop-64", "loop-512", "bytewax", "loop-poll", "faust-take",
        "quix-message"]
PRE_S, BURST_S, POST_S = 3.0, 10.0, 10.0


def burst_schedule(capacity: float, seed: int) -> list[float]:
    """Arrival offsets (s): Poisson at 0.5 C, then 1.5 C for the burst, then 0.5 C."""
    out: list[float] = []
    for k, (start, length, load) in enumerate(((0.0, PRE_S, 0.5), (PRE_S, BURST_S, 1.5),
                                               (PRE_S + BURST_S, POST_S, 0.5))):
        rate = load * capacity
        out += [start + t for t in poisson_schedule(rate, int(rate * length * 1.3) + 20, seed + k) if t < length]
    return out


def run_burst(peer: Peer, bootstrap: str, pool: RequestPool, capacity: float, reference: list[list[float]],
              seed: int) -> dict:
    """One row under the burst; answered or not, every request is in the figures."""
    times = burst_schedule(capacity, seed)
    done = scheduled_run(peer, bootstrap, pool, times, BROKER_PIDS[bootstrap], f"peers-burst-{peer.name}",
                         timeout=30, idle_timeout=8)
    got, sent = done.got, done.sent
    # Each request at its produce time (its result's kafka_ts_ms; the schedule's for one
    # never answered), its latency produce → result, infinite when never answered.
    ts = np.asarray(times[:sent]) * 1000.0
    lat = np.full(sent, np.inf)
    for rid, doc in got.docs.items():
        i = int(rid.rsplit("-", 1)[1])
        ts[i] = doc["kafka_ts_ms"] - done.t0_ms
        lat[i] = got.result_ts[rid] - doc["kafka_ts_ms"]
    r = {"_ts": ts, "_lat": lat}
    in_burst = (ts >= PRE_S * 1000) & (ts < (PRE_S + BURST_S) * 1000)
    return {**correctness(got, pool, reference, sent), "capacity_req_s": capacity, "cpu_cores": done.cores,
            "burst_goodput_x_capacity": window_goodput(r, PRE_S, PRE_S + BURST_S) / capacity,
            "burst_in_slo": float((lat[in_burst] <= SLO_MS).mean()) if in_burst.any() else float("nan"),
            "recovery_s": recovery_s(r, PRE_S + BURST_S),
            "p50_ms": float(np.percentile(lat, 50, method="higher")),
            "p99_ms": float(np.percentile(lat, 99, method="higher")),
            "in_slo": float((lat <= SLO_MS).mean())}


def tidebatch_drained(engine: str) -> float:
    """tidebatch's best median JSON drain (req/s) from bench/peers.py's results."""
    med = report.json_drain_medians(json.loads((OUT / f"peers-{engine}.json").read_text()))
    tide = [v for key, v in med.items() if key.startswith("tidebatch-")]
    if not tide:
        raise SystemExit("no tidebatch JSON drains in the peers results: run bench/peers.py --part drain, or give --capacity")
    return max(tide)


def table(rows: dict[str, list[dict]], capacity: float) -> str:
    lines = [f"burst: 50 % → 150 % for {BURST_S:.0f} s → 50 % of C = {capacity:.0f} req/s, SLO {SLO_MS:.0f} ms",
             "| row | burst goodput (x C) | in SLO during burst | recovery s | p50 / p99 ms | in SLO, whole run "
             "| scored / sent, dup | cores gen / peer / broker / others |",
             "|---|---|---|---|---|---|---|---|"]
    for name, runs in rows.items():
        for r in runs:
            c = r["cpu_cores"]
            lines.append(
                f"| {PEERS[name].label} | {r['burst_goodput_x_capacity']:.2f} | {100 * r['burst_in_slo']:.1f} % "
                f"| {r['recovery_s']:.1f} | {r['p50_ms']:.0f} / {r['p99_ms']:.0f} | {100 * r['in_slo']:.1f} % "
                f"| {r['scored']} / {r['sent']}, {r['duplicates']} "
                f"| {c.get('generator', 0):.2f} / {c.get('worker', 0):.2f} / {c.get('broker', 0):.2f} / "
                f"{c.get('others', 0):.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", choices=("kafka", "embedded", "tansu"), default="kafka")
    ap.add_argument("--only", default=",".join(ROWS), help="rows of bench/peers/launch.py, comma-separated")
    ap.add_argument("--capacity", type=float, default=None, help="C in req/s (default: measured, see above)")
    ap.add_argument("--probes", type=int, default=4, help="bisection steps of the live capacity")
    ap.add_argument("--probe-seconds", type=float, default=6.0)
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the rows, interleaved")
    args = ap.parse_args()
    engine = "tansu" if args.broker == "embedded" else args.broker
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        ap.error(f"unknown rows {unknown}")
    names = [n for n in names if PEERS[n].available()]
    pool = RequestPool(encoding="json")
    ref = reference_scores(pool)
    path = OUT / f"peers-burst-{engine}.json"
    results: dict = {"broker": engine, "rows": {}}
    with local_broker(engine) as broker:
        bs = broker.bootstrap_servers
        capacity = args.capacity
        if capacity is None:
            drained = tidebatch_drained(engine)
            capacity, probes = live_capacity(bs, pool, drained, args.probe_seconds, args.probes)
            results.update(drained_req_s=drained, probes=probes)
            print(f"live capacity {capacity:.0f} req/s (tidebatch drained {drained:.0f})", flush=True)
        results["capacity_req_s"] = capacity
        for k in range(args.repeat):
            for name in names:
                r = run_burst(PEERS[name], bs, pool, capacity, ref, seed=100 * k + 7)
                results["rows"].setdefault(name, []).append(r)
                path.write_text(json.dumps(results, indent=1, default=float))
                print(f"{name}: burst goodput {r['burst_goodput_x_capacity']:.2f}x C, recovery {r['recovery_s']:.1f} s, "
                      f"p99 {r['p99_ms']:.0f} ms, in SLO {100 * r['in_slo']:.1f} %, scored {r['scored']}/{r['sent']}; "
                      f"{cpu_text(r['cpu_cores'])}", flush=True)
    print(table(results["rows"], capacity))
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
