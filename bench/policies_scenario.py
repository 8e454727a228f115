"""One row of bench/policies.py: a fresh `tidebatch run` worker of one policy under an
open-loop load for a while, and what its results say: the SLO outcomes, goodput in a
window, the recovery after a burst, the publisher's spans. Also used by bench/burst.py,
bench/peers_burst.py and bench/calibration.py's tests.
"""

from __future__ import annotations

import time
import uuid

import numpy as np

from bench.harness import (
    RequestPool,
    cpu_shares,
    fresh_topics,
    open_loop,
    read_request_ids,
    read_results,
    routed_rules,
    stages,
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
