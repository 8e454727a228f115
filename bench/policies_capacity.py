"""The capacities bench/policies.py sets its loads by (issue 26): a drained backlog's
(no generator, no live fetches: an upper bound), the live one (the highest rate greedy
keeps up with, within the SLO, while this process generates the load and the broker is
in the loop: bisection) and the throughput one (the rate processed at all). Also used
by bench/burst.py, bench/tenants.py and bench/peers_burst.py.
"""

from __future__ import annotations

import numpy as np

from bench.harness import (
    RequestPool,
    cpu_text,
    drain_throughput,
    fresh_topics,
    preload,
    read_results,
    wait_outcomes,
    worker_process,
)
from bench.policies_scenario import SLO_MS, run_scenario


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
