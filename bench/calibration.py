"""Simulator against the real pipeline (issue 26, item 5): the pure parts of
bench/burst.py's calibration.

A real row records what it offered (harness.open_loop's trace: produce time, rows,
priority per request) and what it measured (p50/p99 of the requests scored, the share
answered within the SLO, the batches' rows and model times, the worker's stage
breakdown). The simulator replays the same arrivals (pipeline/simulate/trace.py read_trace)
on the cost curve and noise fitted to the run's own batches, with the Kafka hop before
the worker (a `to_worker` stage measured where it is transport and not backlog) and the
source thread's cost per request, and predicts the same three figures for the same
policy.

`tidebatch simulate --scenario trace:FILE --curve FILE --hop-ms P50:P99 --decode-us US --noise S`
replays one row by hand: bench/burst.py writes the trace and curve files and prints
the command.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from pipeline.registry.pipelines import get_pipeline
from pipeline.simulate.arrivals import Arrival, with_hops
from pipeline.simulate.curves import Curve, curve_from_dict
from pipeline.simulate.engine import SimConfig, simulate
from pipeline.simulate.specs import policy_spec
from pipeline.simulate.workload import Workload


def write_trace(path: Path, trace: Sequence[tuple[float, int, int]]) -> None:
    """JSONL, one request per line: time (s, the generator's clock), rows, priority:
    what pipeline/simulate/trace.py's read_trace reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for t, rows, prio in trace:
            fh.write(json.dumps({"time": round(t, 6), "rows": rows, "priority": prio}) + "\n")


def fit_curve(points: Iterable[tuple[int, float]], slo_ms: float) -> dict:
    """A curve file's dict over measured (batch rows, model ms) points, one point per
    batch size (its median), so the many small batches of a quiet row do not drown the
    few large ones a burst makes; the simulator fits t(n) = a + b·n through them by
    least squares (pipeline/simulate/curves.py, curve_from_dict)."""
    by_rows: dict[int, list[float]] = {}
    for rows, ms in points:
        by_rows.setdefault(int(rows), []).append(float(ms))
    curve = {"name": "measured", "source": f"{sum(map(len, by_rows.values()))} batches of {len(by_rows)} sizes",
             "points": [[n, statistics.median(ms)] for n, ms in sorted(by_rows.items())],
             "max_batch_rows": get_pipeline("ctr").max_batch_rows, "slo_ms": {"0": slo_ms, "1": slo_ms}}
    curve["noise_sigma"] = noise_sigma(by_rows, curve_from_dict(curve))
    return curve


def noise_sigma(by_rows: dict[int, list[float]], curve: Curve) -> float:
    """The lognormal sigma of the model times around the fitted curve, matched at the
    tail: (ln p99 - ln p50) / z(0.99) of time / t(n). On two cores shared with the
    broker and the generator a batch's time has a heavy tail (p99 several times the
    median), which the simulator's default sigma of 0.1 leaves out."""
    ratios = sorted(ms / (curve.service(n) * 1e3) for n, mss in by_rows.items() for ms in mss)
    p50, p99 = ratios[len(ratios) // 2], ratios[min(len(ratios) - 1, int(0.99 * len(ratios)))]
    return max(0.0, math.log(p99 / p50) / 2.3263)


def hop_of(stage_rows: Sequence[dict]) -> tuple[float, float]:
    """The Kafka hop (p50, p99 ms): medians of the `to_worker` stage over rows."""
    p50 = [r["to_worker"]["p50_ms"] for r in stage_rows if r.get("to_worker", {}).get("p50_ms")]
    p99 = [r["to_worker"]["p99_ms"] for r in stage_rows if r.get("to_worker", {}).get("p99_ms")]
    if not p50 or not p99:
        raise ValueError("no to_worker stage in the rows given")
    lo, hi = statistics.median(p50), statistics.median(p99)
    return lo, max(lo, hi)


def publish_us(spans: Iterable[tuple[int, float]], min_results: int = 4) -> float:
    """The publisher's cost per result, µs: over batches of at least `min_results`
    results, their summed ms from the publisher taking each batch to its last result's
    timestamp over their summed results (bench/policies_scenario.py publish_spans). Summed, not
    a median of per-batch ratios: both ends are whole-millisecond clock readings, so a
    batch of 14 results reads 0 or 1 ms, and at 800 req/s on the embedded broker most
    read 0 (the median said 0 µs); the sum averages the truncation out. 0 with none."""
    kept = [(n, ms) for n, ms in spans if n >= min_results]
    results = sum(n for n, _ in kept)
    return 1000.0 * sum(ms for _, ms in kept) / results if results else 0.0


def predict(produced: Sequence[Arrival], curve: dict, policy: str, *, hop_ms: tuple[float, float],
            decode_us: float, seed: int = 1, publish_us: float = 0.0) -> dict:
    """The simulator's p50/p99 of the requests scored and share answered within the
    SLO, for `policy` (greedy, adaptive: route_late, as bench/policies.py runs them) on
    these arrivals (as produced: the hop is added here), with the publisher's cost per
    result (`--publish-us`: answers after the model, and adaptive's answer tail)."""
    c = curve_from_dict(curve)
    arr = with_hops(produced, *hop_ms, seed=seed)
    span = max(a.origin for a in arr) if arr else 0.0
    res = simulate(Workload("trace", arr, max(span, 1e-3)), c, policy_spec(policy, c),
                   SimConfig(seed=seed, decode_s=decode_us / 1e6, noise=curve.get("noise_sigma", 0.1),
                             publish_s=publish_us / 1e6))
    return {"p50_ms": res.scored_p50_ms, "p99_ms": res.scored_p99_ms,
            "in_slo_share": res.outcomes["in_time"] / max(res.produced, 1),
            "routed_late": res.outcomes["routed_late"]}


def within(predicted: float, measured: float, tolerance: float = 0.30) -> bool:
    """|predicted - measured| <= tolerance x measured."""
    return abs(predicted - measured) <= tolerance * abs(measured)


def paired(greedy: Sequence[dict], adaptive: Sequence[dict]) -> dict:
    """Adaptive over greedy, repeat by repeat (rows matched on `rep`: the two ran back
    to back), then the median and range of those ratios for p99 and goodput. Paired,
    because this machine's speed drifts within a run (the worker used 0.45 cores for
    the load that took 0.68 ten minutes earlier, no other process running): a row's
    figure moves more between repeats than between the two policies of one repeat."""
    by_rep = {r["rep"]: r for r in greedy}
    p99, good = [], []
    for a in adaptive:
        g = by_rep.get(a["rep"])
        if g is None:
            continue
        p99.append(a["p99_ms"] / g["p99_ms"] if g["p99_ms"] > 0 else math.inf)
        ga, gg = a["goodput_x_capacity"], g["goodput_x_capacity"]
        good.append(ga / gg if gg > 0 else (1.0 if ga == 0 else math.inf))
    if not p99:
        raise ValueError("no repeat ran both policies")
    return {"p99": statistics.median(p99), "p99_range": (min(p99), max(p99)),
            "goodput": statistics.median(good), "goodput_range": (min(good), max(good)), "pairs": len(p99)}


def verdict(ratios: dict, tolerance: float = 0.05) -> tuple[bool, str]:
    """Issue 26, item 4, for one scenario's paired ratios: adaptive's p99 at most
    (1 + tolerance) x greedy's and its goodput at least (1 - tolerance) x greedy's,
    median over the repeats."""
    ok = ratios["p99"] <= 1 + tolerance and ratios["goodput"] >= 1 - tolerance
    return ok, (f"p99 {ratios['p99']:.2f}x ({ratios['p99_range'][0]:.2f}-{ratios['p99_range'][1]:.2f}), goodput "
                f"{ratios['goodput']:.2f}x ({ratios['goodput_range'][0]:.2f}-{ratios['goodput_range'][1]:.2f})")
