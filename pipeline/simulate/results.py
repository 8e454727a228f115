"""What one simulated run measures: every request's outcome and latency turned into
latency percentiles, throughput, goodput, batch sizes, and per tenant and per burst
where the workload has them. The run itself is pipeline/simulate/engine.py."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pipeline.simulate.curves import Curve
from pipeline.simulate.percentile import percentile
from pipeline.simulate.workload import Workload

# Every request's one outcome (0 until it has one).
IN_TIME, LATE, ROUTED = 1, 2, 3
OUTCOME_NAMES = {IN_TIME: "in_time", LATE: "scored_late", ROUTED: "routed_late"}
RECOVERY_WINDOW = 0.1  # s of produce time per window when measuring recovery
RECOVERY_OK = 0.99  # a window is recovered when this share of it is answered in SLO


@dataclass
class RunResult:
    policy: str
    settings: str
    scenario: str
    load: float | None
    produced: int
    produced_rows: int
    outcomes: dict[str, int]
    p50_ms: float
    p99_ms: float
    p999_ms: float
    scored_p50_ms: float  # latency of the requests scored (in time or late): a pipeline's results
    scored_p99_ms: float
    throughput_rows_s: float  # rows scored (in time or late) per second of the run
    goodput_rows_s: float  # rows answered within SLO per second of the run
    goodput_req_s: float
    capacity_rows_s: float
    mean_batch_rows: float
    slo_miss_rate: float
    busy_s: float  # executor-seconds spent running batches
    utilization: float  # busy_s / (executors × span from 0 to the last outcome, >= duration)
    duration_s: float
    p99_by_priority_ms: dict[int, float] = field(default_factory=dict)
    burst_goodput_rows_s: float | None = None
    recovery_s: float | None = None
    recovery_censored: bool = False  # never recovered before the run ended: a lower bound
    batches: int = 0
    pauses: int = 0
    by_tenant: dict[str, dict] = field(default_factory=dict)  # _tenant_breakdown
    mixed_batches: int = 0  # batches with requests of more than one tenant

    @property
    def goodput_share(self) -> float:
        return self.goodput_rows_s / self.capacity_rows_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["goodput_share_of_capacity"] = self.goodput_share
        return d


@dataclass
class RunRecord:
    """What a run leaves behind: per request (by index into the workload's arrivals) when
    and how it ended, and the executors' counters."""

    workload: Workload
    curve: Curve
    policy: str  # the label it ran under
    settings: str
    executors: int
    finish: list[float]
    outcome: bytearray
    busy: float  # executor-seconds spent running batches
    batches: int
    batch_rows: int
    pauses: int
    mixed: int  # batches with requests of more than one tenant


def measure(run: RunRecord) -> RunResult:
    w, curve = run.workload, run.curve
    finish, outcome = run.finish, run.outcome
    arrivals = w.arrivals
    n = len(arrivals)
    if any(o == 0 for o in outcome):
        raise AssertionError("a request ended the run without an outcome")
    lat = sorted(finish[i] - arrivals[i].origin for i in range(n))
    # What a pipeline's results give: the latency of the requests scored (in time or
    # late), routed ones apart (bench/burst.py compares the two).
    scored = sorted(finish[i] - arrivals[i].origin for i in range(n) if outcome[i] != ROUTED)
    counts = {name: 0 for name in OUTCOME_NAMES.values()}
    for o in outcome:
        counts[OUTCOME_NAMES[o]] += 1
    D = w.duration
    good_rows = sum(arrivals[i].rows for i in range(n) if outcome[i] == IN_TIME)
    good_req = counts["in_time"]
    scored_rows = sum(arrivals[i].rows for i in range(n) if outcome[i] != ROUTED and finish[i] <= D)
    by_prio: dict[int, list[float]] = {}
    for i in range(n):
        by_prio.setdefault(arrivals[i].priority, []).append(finish[i] - arrivals[i].origin)
    res = RunResult(
        policy=run.policy,
        settings=run.settings,
        scenario=w.name,
        load=w.load,
        produced=n,
        produced_rows=sum(a.rows for a in arrivals),
        outcomes=counts,
        p50_ms=percentile(lat, 0.5) * 1e3,
        p99_ms=percentile(lat, 0.99) * 1e3,
        p999_ms=percentile(lat, 0.999) * 1e3,
        scored_p50_ms=percentile(scored, 0.5) * 1e3,
        scored_p99_ms=percentile(scored, 0.99) * 1e3,
        throughput_rows_s=scored_rows / D,
        goodput_rows_s=good_rows / D,
        goodput_req_s=good_req / D,
        capacity_rows_s=curve.capacity,
        mean_batch_rows=run.batch_rows / run.batches if run.batches else 0.0,
        slo_miss_rate=1.0 - good_req / n if n else 0.0,
        busy_s=run.busy,
        utilization=run.busy / (run.executors * max(D, max(finish, default=D))),
        duration_s=D,
        p99_by_priority_ms={p: percentile(sorted(v), 0.99) * 1e3 for p, v in sorted(by_prio.items())},
        batches=run.batches,
        pauses=run.pauses,
        mixed_batches=run.mixed,
    )
    if any(a.tenant is not None for a in arrivals):
        res.by_tenant = _tenant_breakdown(run)
    if w.burst:
        _burst_metrics(run, res, *w.burst)
    return res


def _tenant_breakdown(run: RunRecord) -> dict[str, dict]:
    """Per tenant: offered and in-SLO rows/s over capacity, goodput (in-SLO share
    of its rows), p99 latency, and the outcomes of its requests."""
    arrivals, D, cap = run.workload.arrivals, run.workload.duration, run.curve.capacity
    lat: dict[str, list[float]] = {}
    rows: dict[str, list[int]] = {}  # offered, in time, routed
    for i, a in enumerate(arrivals):
        name = a.tenant or "default"
        lat.setdefault(name, []).append(run.finish[i] - a.origin)
        r = rows.setdefault(name, [0, 0, 0])
        r[0] += a.rows
        r[1] += a.rows if run.outcome[i] == IN_TIME else 0
        r[2] += a.rows if run.outcome[i] == ROUTED else 0
    return {
        name: {
            "offered_share": r[0] / D / cap,
            "good_share": r[1] / D / cap,
            "goodput": r[1] / r[0] if r[0] else 1.0,
            "routed_rows": r[2],
            "p99_ms": percentile(sorted(lat[name]), 0.99) * 1e3,
        }
        for name, r in sorted(rows.items())
    }


def _burst_metrics(run: RunRecord, res: RunResult, b0: float, b1: float) -> None:
    arrivals, outcome = run.workload.arrivals, run.outcome
    good = sum(a.rows for i, a in enumerate(arrivals) if b0 <= a.origin < b1 and outcome[i] == IN_TIME)
    res.burst_goodput_rows_s = good / (b1 - b0)
    # Recovery: from the end of the burst until every later window of produce time
    # is answered within SLO again (RECOVERY_OK of its requests).
    nwin = max(1, math.ceil((run.workload.duration - b1) / RECOVERY_WINDOW))
    tot, ok = [0] * nwin, [0] * nwin
    for i, a in enumerate(arrivals):
        if a.origin >= b1:
            k = min(int((a.origin - b1) / RECOVERY_WINDOW), nwin - 1)
            tot[k] += 1
            ok[k] += outcome[i] == IN_TIME
    last_bad = -1
    for k in range(nwin):
        if tot[k] and ok[k] < RECOVERY_OK * tot[k]:
            last_bad = k
    res.recovery_s = (last_bad + 1) * RECOVERY_WINDOW
    res.recovery_censored = last_bad == nwin - 1
