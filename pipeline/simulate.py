"""Discrete-event simulator for the batching core.

It replays the very same Batcher and policy code the worker runs, on a FakeClock,
against an arrival trace and a latency curve t(n) = a + b·n, so policies can be
compared on curves this machine does not have (GPU-like ones) in a fraction of the
simulated time, deterministically.

Model of one worker:

  producers ──► Kafka backlog (unbounded FIFO) ──► bounded in-time queue ──► k executors
                     ▲ paused while the queue is above its high watermark (rows),
                       resumed below the low one — the worker's backpressure.

- Each request's deadline is its produce time plus the SLO budget of its priority
  (a per-request deadline in a trace may only tighten it).
- An executor runs a batch in t(padded rows) × noise, noise lognormal with mean 1.
- The cost model starts from the true curve (as the worker's warm-up profile would)
  and then learns online from the noisy service times, like the worker.
- Every request gets exactly one outcome: scored in time, scored late (after its
  deadline), or routed late (published unscored to the late topic). Latency is from
  produce to that outcome.
- Produce is arrival unless the Kafka hop is modelled (`hop_ms`, `--hop-ms`): then each
  request reaches the worker a lognormal delay after it was produced, and its deadline,
  age and latency still count from its produce time, as the worker's count from the
  record's Kafka timestamp (docs/OPERATIONS.md, "Where the time goes": `to_worker`).
- Load is relative to the curve's capacity: max_batch_rows / t(max_batch_rows) rows/s.
- Decoding is free unless SimConfig.decode_s (`--decode-us`) says what a request costs
  the source thread. Then a single source takes up to `poll_records` from the backlog at
  a time and queues them together once all are decoded, as the worker does, and with
  adaptive + route_late it routes late undecoded the records the worker would
  (pipeline/batching/shed.py, pipeline/worker/admission.py): on the reserve while a
  backlog stands (StandingBacklog), else only the expired. In the real CTR pipeline
  the source thread, not the model, is what a burst saturates (docs/BATCHING.md).
- A request is answered when the model ends unless SimConfig.publish_s (`--publish-us`)
  says what handing its result over costs: then a publisher, separate from the
  executors, hands a batch's results over one after another once the model is done
  (and once it has finished the batches before), and the batcher gets each deadline
  less the answer tail it learns from that, as the worker's admission does
  (pipeline/batching/tail.py).
"""

from __future__ import annotations

import csv
import heapq
import json
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.registry import make_policy
from pipeline.batching.request import Batch, Request
from pipeline.batching.shed import (
    DEFAULT_RESERVE,
    AnswerTime,
    StandingBacklog,
    keep_one_to_learn,
    reserve_ms,
    shed_count,
)
from pipeline.batching.tail import AnswerTail
from pipeline.batching.tenants import TenantClass, TenantGate
from pipeline.clock import FakeClock
from pipeline.errors import UserError

CURVES_DIR = Path(__file__).parent / "curves"

IN_TIME, LATE, ROUTED = 1, 2, 3
OUTCOME_NAMES = {IN_TIME: "in_time", LATE: "scored_late", ROUTED: "routed_late"}

# Fixed scenario shapes (load relative to capacity), from the issues.
BURST_BASE, BURST_PEAK, BURST_LEN, BURST_START = 0.5, 1.5, 10.0, 2.0
OVERLOAD_LOAD = 1.2
PRIORITIES_LOAD, PRIORITIES_HIGH_SHARE = 1.1, 0.2
RECOVERY_WINDOW = 0.1  # s of produce time per window when measuring recovery
RECOVERY_OK = 0.99  # a window is recovered when this share of it is answered in SLO


# ---------------------------------------------------------------------------- curves
@dataclass(frozen=True)
class Curve:
    """A model's cost per call, t(n) = a + b·n seconds, with its batching limit and the
    SLO budget of each priority level."""

    name: str
    a: float  # seconds per call
    b: float  # seconds per row
    max_batch_rows: int
    slo: dict[int, float]  # priority -> budget, seconds
    source: str = ""

    def service(self, rows: int) -> float:
        return self.a + self.b * rows

    @property
    def capacity(self) -> float:
        """Rows/s with full batches back to back."""
        return self.max_batch_rows / self.service(self.max_batch_rows)

    def budget(self, priority: int) -> float:
        """SLO budget of a priority level; an undeclared level gets the loosest one."""
        return self.slo.get(priority, self.slo[max(self.slo)])


def _fit_points(points: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Least-squares a, b (ms) through measured (rows, ms) points."""
    if len(points) < 2:
        raise UserError("a measured curve needs at least two (rows, ms) points")
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise UserError("a measured curve needs points at two different batch sizes")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return max(my - b * mx, 0.0), max(b, 1e-9)


def curve_from_dict(d: dict, name: str = "curve") -> Curve:
    try:
        if "points" in d:
            a_ms, b_ms = _fit_points(d["points"])
        else:
            a_ms, b_ms = float(d["a_ms"]), float(d["b_ms_per_row"])
        slo = {int(k): float(v) / 1e3 for k, v in d.get("slo_ms", {"0": 100}).items()}
        return Curve(
            name=str(d.get("name", name)),
            a=a_ms / 1e3,
            b=b_ms / 1e3,
            max_batch_rows=int(d.get("max_batch_rows", 512)),
            slo=slo,
            source=str(d.get("source", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"curve {name!r}: bad or missing field ({exc})") from None


def load_curve(spec: str) -> Curve:
    """A shipped curve by name (pipeline/curves/NAME.json), a JSON file path, or
    ab:A_MS:B_MS[:MAX_ROWS[:SLO_MS]] inline."""
    if spec.startswith("ab:"):
        parts = spec.split(":")[1:]
        try:
            a_ms, b_ms = float(parts[0]), float(parts[1])
            max_rows = int(parts[2]) if len(parts) > 2 else 512
            slo_ms = float(parts[3]) if len(parts) > 3 else 100.0
        except (IndexError, ValueError):
            raise UserError(f"bad curve {spec!r}; expected ab:A_MS:B_MS[:MAX_ROWS[:SLO_MS]]") from None
        return curve_from_dict(
            {"name": spec, "a_ms": a_ms, "b_ms_per_row": b_ms, "max_batch_rows": max_rows,
             "slo_ms": {"0": slo_ms, "1": 2 * slo_ms}},
            spec,
        )
    name, data = read_curve_file(spec, "batch")
    return curve_from_dict(data, name)


# A curve file's "kind": "batch" (t(n) = a + b·n per call, the default when absent) or
# "generation" (a decoder's per-step cost, pipeline/generation/cost.py).
CURVE_KINDS = ("batch", "generation")


def read_curve_file(spec: str, kind: str) -> tuple[str, dict]:
    """The name and JSON of a curve: a shipped one by name (pipeline/curves/NAME.json)
    or a file path; refused with one line when it is not of `kind`."""
    path = Path(spec)
    if not path.exists():
        path = CURVES_DIR / f"{spec}.json"
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in CURVES_DIR.glob("*.json")))
        raise UserError(f"unknown curve {spec!r}; shipped curves: {names}; or a JSON file, or ab:A_MS:B_MS")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"curve file {path}: not valid JSON ({exc})") from None
    found = data.get("kind", "batch") if isinstance(data, dict) else None
    if found != kind:
        hint = "tidebatch simulate --workload generate" if found == "generation" else "tidebatch simulate"
        raise UserError(f"curve {spec!r} is a {found!r} curve, not a {kind!r} one (use it with {hint})")
    return path.stem, data


# ---------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class RowsDist:
    """Rows per request (or, for the generation workload, prompt and output tokens):
    fixed:N, geometric:MEAN, lognormal:MEAN:SIGMA, uniform:LO:HI, loguniform:LO:HI
    (uniform in log: as many 8-16 as 128-256, the skew of chat answers' lengths)."""

    kind: str
    p1: float
    p2: float = 0.0

    @classmethod
    def parse(cls, spec: str) -> RowsDist:
        parts = spec.split(":")
        try:
            kind = parts[0]
            nums = [float(x) for x in parts[1:]]
            if kind == "fixed" and len(nums) == 1 and nums[0] >= 1:
                return cls(kind, nums[0])
            if kind == "geometric" and len(nums) == 1 and nums[0] >= 1:
                return cls(kind, nums[0])
            if kind == "lognormal" and len(nums) == 2 and nums[0] >= 1 and nums[1] >= 0:
                return cls(kind, nums[0], nums[1])
            if kind in ("uniform", "loguniform") and len(nums) == 2 and 1 <= nums[0] <= nums[1]:
                return cls(kind, nums[0], nums[1])
        except ValueError:
            pass
        raise UserError(
            f"bad rows distribution {spec!r}; use fixed:N, geometric:MEAN, "
            "lognormal:MEAN:SIGMA, uniform:LO:HI or loguniform:LO:HI"
        )

    @property
    def mean(self) -> float:
        if self.kind == "uniform":
            return (self.p1 + self.p2) / 2
        if self.kind == "loguniform":
            lo, hi = self.p1, self.p2
            return lo if hi == lo else (hi - lo) / math.log(hi / lo)
        return self.p1  # the others are parameterised by their (approximate) mean

    def sampler(self, rng: random.Random) -> Callable[[], int]:
        if self.kind == "fixed":
            n = int(self.p1)
            return lambda: n
        if self.kind == "geometric":
            p = 1.0 / self.p1
            log1p = math.log(1.0 - p) if p < 1 else -math.inf
            return lambda: 1 + (int(math.log(1.0 - rng.random()) / log1p) if p < 1 else 0)
        if self.kind == "lognormal":
            sigma = self.p2
            mu = math.log(self.p1) - sigma * sigma / 2  # mean of the lognormal = p1
            return lambda: max(1, round(rng.lognormvariate(mu, sigma)))
        lo, hi = int(self.p1), int(self.p2)
        if self.kind == "loguniform":
            llo, lhi = math.log(lo), math.log(hi)
            return lambda: min(hi, max(lo, round(math.exp(rng.uniform(llo, lhi)))))
        return lambda: rng.randint(lo, hi)


DEFAULT_ROWS = "lognormal:20:0.5"  # CTR requests: ~20 candidate items each

# Simulated seconds per scenario when --duration is not given: long enough for the
# burst's recovery, and for a 20 000-row queue to fill at 110 % (priorities).
DEFAULT_DURATION = {"burst": 25.0, "overload": 10.0, "priorities": 20.0}
STEADY_DURATION = 10.0


def default_duration(scenario: str) -> float:
    return DEFAULT_DURATION.get(scenario.split(":")[0], STEADY_DURATION)


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float  # produce time, seconds
    rows: int
    priority: int = 0
    deadline: float | None = None  # absolute, may only tighten produce + SLO
    tenant: str | None = None  # scenario tenants (pipeline/simulate_tenants.py)
    sent: float | None = None  # produce time when t is the arrival at the worker (with_hops)

    @property
    def origin(self) -> float:
        """Produce time: what deadlines, ages and latencies count from."""
        return self.t if self.sent is None else self.sent


def with_hops(arrivals: Sequence[Arrival], p50_ms: float, p99_ms: float, seed: int = 1) -> list[Arrival]:
    """The arrivals as the worker receives them after the Kafka hop (produce, append,
    fetch): each delayed by a lognormal draw with this median and 99th percentile
    (a run's `to_worker` stage at low load, where it is transport, not backlog), in
    order of arrival at the worker."""
    delay = hop_sampler(p50_ms, p99_ms, seed)
    out = [Arrival(a.origin + delay(), a.rows, a.priority, a.deadline, a.tenant, a.origin) for a in arrivals]
    out.sort(key=lambda a: a.t)
    return out


def hop_sampler(p50_ms: float, p99_ms: float, seed: int = 1) -> Callable[[], float]:
    """Seconds of one Kafka hop: a lognormal draw with this median and 99th percentile
    (with_hops; the generation simulator's arrivals, pipeline/generation/simulate.py)."""
    if p50_ms <= 0 or p99_ms < p50_ms:
        raise UserError(f"hop: need 0 < p50 <= p99 ms, got {p50_ms:g}:{p99_ms:g}")
    rng = random.Random(seed + 65537)
    mu, sigma = math.log(p50_ms / 1e3), math.log(p99_ms / p50_ms) / 2.3263  # z of the 99th percentile
    return lambda: rng.lognormvariate(mu, sigma)


@dataclass
class Workload:
    """What a scenario produces: arrivals plus the windows the metrics look at."""

    name: str
    arrivals: list[Arrival]
    duration: float
    load: float | None = None  # steady load, relative to capacity, where one applies
    burst: tuple[float, float] | None = None  # [start, end) of a burst window
    segments: list[tuple[float, float, float]] = field(default_factory=list)


def poisson_arrivals(
    segments: Sequence[tuple[float, float, float]],
    rows: RowsDist,
    capacity: float,
    seed: int,
    high_share: float | None = None,
) -> list[Arrival]:
    """Piecewise-constant Poisson process: each segment (start, end, load) produces
    load × capacity rows/s on average, in requests of `rows` rows."""
    rng = random.Random(seed)
    draw = rows.sampler(random.Random(seed + 7919))
    prio_rng = random.Random(seed + 104729)
    out: list[Arrival] = []
    for start, end, load in segments:
        rate = load * capacity / rows.mean  # requests/s
        if rate <= 0:
            continue
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            prio = 0 if high_share is None else (0 if prio_rng.random() < high_share else 1)
            out.append(Arrival(t, draw(), prio))
    return out


def _scenario_segments(name: str, load: float, duration: float) -> tuple[list, tuple | None]:
    if name == "poisson":
        return [(0.0, duration, load)], None
    if name.startswith("onoff"):
        # onoff[:ON_S:OFF_S]: bursts at load × (on+off)/on, silence in between: mean = load.
        parts = name.split(":")[1:]
        try:
            on, off = (float(parts[0]), float(parts[1])) if parts else (1.0, 1.0)
        except (IndexError, ValueError):
            on = off = -1.0
        if on <= 0 or off < 0 or len(parts) not in (0, 2):
            raise UserError(f"bad scenario {name!r}; use onoff or onoff:ON_S:OFF_S")
        peak = load * (on + off) / on
        segs, t = [], 0.0
        while t < duration:
            segs.append((t, min(t + on, duration), peak))
            t += on + off
        return segs, None
    if name == "diurnal":
        # One "day" compressed into the run: from 20 % to 180 % of the mean load and back.
        step = max(duration / 200, 0.05)
        segs, t = [], 0.0
        while t < duration:
            mid = t + step / 2
            segs.append((t, min(t + step, duration), load * (1 - 0.8 * math.cos(2 * math.pi * mid / duration))))
            t += step
        return segs, None
    if name == "burst":
        end = BURST_START + BURST_LEN
        if duration <= end:
            raise UserError(f"scenario burst needs --duration > {end:g} s (a {BURST_LEN:g} s burst at {BURST_START:g} s)")
        return [
            (0.0, BURST_START, BURST_BASE),
            (BURST_START, end, BURST_PEAK),
            (end, duration, BURST_BASE),
        ], (BURST_START, end)
    if name == "overload":
        return [(0.0, duration, OVERLOAD_LOAD)], None
    if name == "priorities":
        return [(0.0, duration, PRIORITIES_LOAD)], None
    raise UserError(
        f"unknown scenario {name!r}; use poisson, onoff[:ON:OFF], diurnal, burst, overload, "
        "priorities or trace:FILE"
    )


def make_workload(
    scenario: str,
    curve: Curve,
    *,
    load: float = 0.5,
    duration: float = 20.0,
    rows: RowsDist | str = DEFAULT_ROWS,
    seed: int = 1,
    hop_ms: tuple[float, float] | None = None,
) -> Workload:
    """Arrivals for a named scenario (load applies to poisson, onoff and diurnal);
    hop_ms (p50, p99): the Kafka hop before the worker (with_hops)."""
    if isinstance(rows, str):
        rows = RowsDist.parse(rows)
    if scenario.startswith("trace:"):
        arrivals = read_trace(scenario[len("trace:"):])
        if not arrivals:
            raise UserError(f"{scenario}: the trace has no records")
        # The span of production (at least 1 ms, so rates stay finite).
        duration = max(arrivals[-1].t, 1e-3)
        if hop_ms is not None:
            arrivals = with_hops(arrivals, *hop_ms, seed=seed)
        return Workload(scenario, arrivals, duration=duration)
    if duration <= 0:
        raise UserError("--duration must be > 0")
    segments, burst = _scenario_segments(scenario, load, duration)
    high_share = PRIORITIES_HIGH_SHARE if scenario == "priorities" else None
    arrivals = poisson_arrivals(segments, rows, curve.capacity, seed, high_share)
    if hop_ms is not None:
        arrivals = with_hops(arrivals, *hop_ms, seed=seed)
    steady = load if is_steady(scenario) else None
    return Workload(scenario, arrivals, duration, steady, burst, list(segments))


def is_steady(scenario: str) -> bool:
    """Scenarios that take --load (the others have their load built in)."""
    return scenario == "poisson" or scenario == "diurnal" or scenario.startswith("onoff")


def read_trace(path: str) -> list[Arrival]:
    """A recorded trace: CSV with a header, or JSONL; fields time (s), rows, and
    optionally priority and deadline (absolute seconds on the trace's clock). Times are
    shifted so the first arrival is at 0 (a trace may carry epoch timestamps)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"trace file {path} not found")
    records: list[dict] = []
    try:
        if p.suffix in (".jsonl", ".json", ".ndjson"):
            for line in p.read_text().splitlines():
                if line.strip():
                    records.append(json.loads(line))
        else:
            with p.open(newline="") as fh:
                records = list(csv.DictReader(fh))
        out = []
        for r in records:
            t = float(r.get("time", r.get("t")))  # type: ignore[arg-type]
            deadline = r.get("deadline")
            out.append(
                Arrival(
                    t,
                    max(1, int(float(r.get("rows", 1)))),
                    int(float(r.get("priority") or 0)),
                    float(deadline) if deadline not in (None, "") else None,
                )
            )
    except (TypeError, ValueError, json.JSONDecodeError) as exc:
        raise UserError(f"trace file {path}: bad record ({exc}); need time, rows[, priority, deadline]") from None
    out.sort(key=lambda a: a.t)
    if out and out[0].t != 0.0:
        t0 = out[0].t
        out = [Arrival(a.t - t0, a.rows, a.priority, None if a.deadline is None else a.deadline - t0) for a in out]
    return out


# ---------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class PolicySpec:
    """A named policy configuration as the simulator runs it."""

    label: str
    policy: str
    params: dict
    batcher: dict

    def describe(self) -> str:
        shown = {**self.params, **self.batcher}
        if "max_queue_delay" in shown:
            shown["max_queue_delay_ms"] = round(shown.pop("max_queue_delay") * 1e3, 3)
        return ", ".join(f"{k}={v}" for k, v in shown.items())


STATIC_64 = (64, 0.010)  # "as commonly deployed": 64 rows, 10 ms linger
DEFAULT_POLICIES = ("none", "static-64", "static-tuned", "greedy", "adaptive")


def policy_spec(label: str, curve: Curve, tuned: tuple[int, float] | None = None) -> PolicySpec:
    """none · static-64 · static-tuned · static:ROWS:DELAY_MS · greedy · adaptive ·
    adaptive-score (expiry score_late) · adaptive-hold (hold_for_efficiency)."""
    mx = curve.max_batch_rows
    if label == "none":
        return PolicySpec(label, "none", {}, {})
    if label == "greedy":
        return PolicySpec(label, "greedy", {"max_batch_rows": mx}, {})
    if label in ("static-64", "static-tuned") or label.startswith("static:"):
        if label == "static-64":
            rows, delay = STATIC_64
        elif label == "static-tuned":
            if tuned is None:
                raise UserError("static-tuned needs the grid search (tune_static) first")
            rows, delay = tuned
        else:
            try:
                _, r, d = label.split(":")
                rows, delay = int(r), float(d) / 1e3
            except ValueError:
                raise UserError(f"bad static policy {label!r}; use static:ROWS:DELAY_MS") from None
        return PolicySpec(label, "static", {"max_batch_rows": rows, "max_queue_delay": delay}, {})
    if label.startswith("adaptive"):
        variants = set(label.split("-")[1:])
        unknown = variants - {"score", "hold"}
        if unknown:
            raise UserError(f"bad adaptive variant {label!r}; use adaptive, adaptive-score, adaptive-hold")
        params = {"max_batch_rows": mx, "hold_for_efficiency": "hold" in variants}
        # Default expiry action in the simulator: route_late (an immediate late-topic
        # record); adaptive-score keeps them in the late lane and scores them later.
        action = "score_late" if "score" in variants else "route_late"
        return PolicySpec(label, "adaptive", params, {"expiry_action": action})
    raise UserError(f"unknown policy {label!r}; use {', '.join(DEFAULT_POLICIES)}, static:ROWS:DELAY_MS, adaptive-score, adaptive-hold")


# ---------------------------------------------------------------------------- the run
@dataclass
class SimConfig:
    executors: int = 1
    noise: float = 0.1  # sigma of the lognormal multiplicative noise on service times
    seed: int = 1
    high_watermark: int = 20_000  # rows, the worker's default (batching.queue_high_rows)
    low_watermark: int | None = None  # default half the high watermark
    # Tenant classes by name (batching/tenants.py): a fresh TenantGate per run; None:
    # one shared queue, as the worker without a `tenants:` section.
    tenants: dict[str, TenantClass] | None = None
    decode_s: float = 0.0  # source-thread seconds per request; 0: admission is free
    poll_records: int = 1000  # records per poll, the worker's
    shed_reserve: float = DEFAULT_RESERVE  # Admission's reserve (route_late only)
    # Per-tenant SLA, seconds by tenant name (pipeline/simulate_tenants.py): a request's
    # budget, whatever its priority, as a `tenants:` class's slo_ms gives it in the
    # worker (pipeline/tenants_config.py); absent tenants get the curve's budget.
    tenant_slo: dict[str, float] | None = None
    publish_s: float = 0.0  # publisher-thread seconds per result; 0: answered at the model's end


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
    by_tenant: dict[str, dict] = field(default_factory=dict)  # _Sim._tenant_breakdown
    mixed_batches: int = 0  # batches with requests of more than one tenant

    @property
    def goodput_share(self) -> float:
        return self.goodput_rows_s / self.capacity_rows_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["goodput_share_of_capacity"] = self.goodput_share
        return d


def _percentile(sorted_vals: Sequence[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


class _Sim:
    """One run: the event loop and its bookkeeping."""

    def __init__(self, workload: Workload, curve: Curve, spec: PolicySpec, cfg: SimConfig) -> None:
        self.w, self.curve, self.spec, self.cfg = workload, curve, spec, cfg
        policy = make_policy(spec.policy, **spec.params)
        cost = CostModel(prior=AffineCost(curve.a, curve.b))
        gate = TenantGate(cfg.tenants) if cfg.tenants else None
        self.batcher = Batcher(policy, cost, **spec.batcher, tenants=gate)
        self.clock = FakeClock()
        n = len(workload.arrivals)
        self.deadline = [0.0] * n
        self.finish = [math.inf] * n
        self.outcome = bytearray(n)
        self.backlog: deque[int] = deque()
        self.paused = False
        self.high = cfg.high_watermark
        self.low = cfg.high_watermark // 2 if cfg.low_watermark is None else cfg.low_watermark
        self.free = cfg.executors
        self.events: list[tuple[float, int, Batch | None, float]] = []
        self.seq = 0
        self.timer: float | None = None
        self.noise_rng = random.Random(cfg.seed + 31337)
        self.busy = 0.0
        self.batches = 0
        self.batch_rows = 0
        self.pauses = 0
        self.mixed = 0  # batches with requests of more than one tenant
        # The source thread (cfg.decode_s > 0): the poll being decoded and when it is done.
        self.decoding: list[int] = []
        self.decoded_at = math.inf
        self.sheds = spec.policy == "adaptive" and spec.batcher.get("expiry_action", "route_late") == "route_late"
        self.answer_time = AnswerTime()  # decode to answer, as the worker's admission learns it
        self.standing = StandingBacklog()  # whether a backlog stands, as admission's
        self.loosest = max(curve.slo.values())
        self.publisher_free = 0.0  # when the publisher has handed over every result so far (publish_s)
        self.tail = AnswerTail()  # model end to a batch's last result, as the worker's admission learns it

    # -- requests in and out ----------------------------------------------------
    def _admit(self, i: int, now: float) -> None:
        a = self.w.arrivals[i]
        deadline = self.deadline[i]
        if self.cfg.publish_s > 0:  # the model must be done before the answer tail
            deadline -= self.tail.for_budget((deadline - a.origin) * 1000.0) / 1000.0
        self.batcher.add(Request(a.rows, now, deadline, a.priority, 0, i, tenant=a.tenant, due=self.deadline[i]), now)
        self._collect_routed(now)
        if not self.paused and self.batcher.backpressure_rows >= self.high:
            self.paused = True
            self.pauses += 1

    def _collect_routed(self, now: float) -> None:
        if not self.batcher.routed_pending:
            return
        for req in self.batcher.pop_routed_late():
            self.finish[req.item] = now
            self.outcome[req.item] = ROUTED

    def _complete(self, batch: Batch, service: float, now: float) -> None:
        self.free += 1
        self.batcher.observe(batch, service)
        answered = [now] * len(batch.requests)
        if self.cfg.publish_s > 0:
            start = max(now, self.publisher_free)
            answered = [start + (k + 1) * self.cfg.publish_s for k in range(len(batch.requests))]
            self.publisher_free = answered[-1] if answered else start
            self.tail.observe((self.publisher_free - now) * 1000.0)
        if self.sheds:
            self.answer_time.observe([(t - req.arrival) * 1000.0 for t, req in zip(answered, batch.requests, strict=True)])
        for t, req in zip(answered, batch.requests, strict=True):
            i = req.item
            self.finish[i] = t
            self.outcome[i] = IN_TIME if t <= self.deadline[i] else LATE

    # -- dispatch ------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        while self.free > 0 and len(self.batcher):
            batch = self.batcher.next_batch(now)
            self._collect_routed(now)
            if batch is None:
                wake = self.batcher.next_wakeup()
                if wake is not None and wake != self.timer:
                    self.timer = max(wake, math.nextafter(now, math.inf))
                    self._push(self.timer, None, 0.0)
                return
            self.free -= 1
            rows = batch.pad_to_rows or batch.rows
            service = self.curve.service(rows)
            if self.cfg.noise > 0:
                s = self.cfg.noise
                service *= self.noise_rng.lognormvariate(-s * s / 2, s)
            self.busy += service
            self.batches += 1
            self.batch_rows += batch.rows
            self.mixed += len({r.tenant for r in batch.requests}) > 1
            self._push(now + service, batch, service)

    def _push(self, t: float, batch: Batch | None, service: float) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, batch, service))

    def _pump(self, now: float) -> None:
        """Dispatch, then resume the consumer if the queue fell below the low watermark
        (pulling the backlog may enable more dispatches)."""
        while True:
            self._dispatch(now)
            if not (self.paused and self.batcher.backpressure_rows <= self.low):
                return
            self.paused = False
            if self.cfg.decode_s > 0:
                self._poll(now)
                return
            while self.backlog and not self.paused:
                self._admit(self.backlog.popleft(), now)

    # -- the source thread (cfg.decode_s > 0) ------------------------------------------
    def _poll(self, now: float) -> None:
        """Take the next poll from the backlog if the source is free: route late what
        admission would (pipeline/worker/admission.py), decode the rest."""
        if self.decoding or self.paused or not self.backlog:
            return
        poll = [self.backlog.popleft() for _ in range(min(self.cfg.poll_records, len(self.backlog)))]
        if self.sheds:
            ages_ms = [(now - self.w.arrivals[i].origin) * 1000.0 for i in poll]  # FIFO: oldest first
            budget_ms = self.loosest * 1000.0
            shed = expired = sum(1 for age in ages_ms if age > budget_ms)
            # On the reserve only while a backlog stands (pipeline/worker/admission.py).
            if self.standing.poll(now * 1000.0, max(ages_ms), budget_ms):
                horizon_ms = budget_ms - reserve_ms(budget_ms, self.cfg.shed_reserve, self.answer_time.ms)
                on_reserve = shed_count(ages_ms, self.cfg.decode_s * 1000.0, horizon_ms) - expired
                shed += keep_one_to_learn(on_reserve, len(poll) - expired, self.answer_time.ms is not None)
            for i in poll[:shed]:
                self.finish[i] = now
                self.outcome[i] = ROUTED
            poll = poll[shed:]
        if poll:
            self.decoding = poll
            self.decoded_at = now + len(poll) * self.cfg.decode_s

    def _decoded(self, now: float) -> None:
        poll, self.decoding, self.decoded_at = self.decoding, [], math.inf
        for i in poll:
            self._admit(i, now)
        self._poll(now)

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        arrivals = self.w.arrivals
        curve = self.curve
        n = len(arrivals)
        i = 0
        events = self.events
        while i < n or events or self.decoding:
            t_arr = arrivals[i].t if i < n else math.inf
            if self.decoded_at <= t_arr and (not events or self.decoded_at <= events[0][0]):
                now = self.decoded_at
                self.clock.set(now)
                self._decoded(now)
            elif events and events[0][0] <= t_arr:
                now, _, batch, service = heapq.heappop(events)
                self.clock.set(now)
                if batch is not None:
                    self._complete(batch, service, now)
                elif now == self.timer:
                    self.timer = None
            else:
                now = t_arr
                self.clock.set(now)
                a = arrivals[i]
                slo = self.cfg.tenant_slo
                budget = a.origin + (slo[a.tenant] if slo and a.tenant in slo else curve.budget(a.priority))
                self.deadline[i] = budget if a.deadline is None else min(budget, a.deadline)
                if self.cfg.decode_s > 0:
                    self.backlog.append(i)
                    self._poll(now)
                elif self.paused or self.backlog:
                    self.backlog.append(i)
                else:
                    self._admit(i, now)
                i += 1
            self._pump(now)
            if not events and i >= n and not self.decoding and (len(self.batcher) or self.backlog):
                # Nothing left to wake the loop: flush (cannot happen with the shipped
                # policies; a guard against a policy that waits forever).
                for b in self.batcher.drain(now):
                    self.free -= 1
                    self._push(now + curve.service(b.pad_to_rows or b.rows), b, 0.0)
                while self.backlog:
                    self._admit(self.backlog.popleft(), now)
        self._collect_routed(self.clock.now())

    # -- metrics ---------------------------------------------------------------------
    def result(self) -> RunResult:
        w, curve = self.w, self.curve
        arrivals = w.arrivals
        n = len(arrivals)
        if any(o == 0 for o in self.outcome):
            raise AssertionError("a request ended the run without an outcome")
        lat = sorted(self.finish[i] - arrivals[i].origin for i in range(n))
        # What a pipeline's results give: the latency of the requests scored (in time or
        # late), routed ones apart (bench/burst.py compares the two).
        scored = sorted(self.finish[i] - arrivals[i].origin for i in range(n) if self.outcome[i] != ROUTED)
        counts = {name: 0 for name in OUTCOME_NAMES.values()}
        for o in self.outcome:
            counts[OUTCOME_NAMES[o]] += 1
        D = w.duration
        good_rows = sum(arrivals[i].rows for i in range(n) if self.outcome[i] == IN_TIME)
        good_req = counts["in_time"]
        scored_rows = sum(
            arrivals[i].rows for i in range(n) if self.outcome[i] != ROUTED and self.finish[i] <= D
        )
        by_prio: dict[int, list[float]] = {}
        for i in range(n):
            by_prio.setdefault(arrivals[i].priority, []).append(self.finish[i] - arrivals[i].origin)
        res = RunResult(
            policy=self.spec.label,
            settings=self.spec.describe(),
            scenario=w.name,
            load=w.load,
            produced=n,
            produced_rows=sum(a.rows for a in arrivals),
            outcomes=counts,
            p50_ms=_percentile(lat, 0.5) * 1e3,
            p99_ms=_percentile(lat, 0.99) * 1e3,
            p999_ms=_percentile(lat, 0.999) * 1e3,
            scored_p50_ms=_percentile(scored, 0.5) * 1e3,
            scored_p99_ms=_percentile(scored, 0.99) * 1e3,
            throughput_rows_s=scored_rows / D,
            goodput_rows_s=good_rows / D,
            goodput_req_s=good_req / D,
            capacity_rows_s=curve.capacity,
            mean_batch_rows=self.batch_rows / self.batches if self.batches else 0.0,
            slo_miss_rate=1.0 - good_req / n if n else 0.0,
            busy_s=self.busy,
            utilization=self.busy / (self.cfg.executors * max(D, max(self.finish, default=D))),
            duration_s=D,
            p99_by_priority_ms={p: _percentile(sorted(v), 0.99) * 1e3 for p, v in sorted(by_prio.items())},
            batches=self.batches,
            pauses=self.pauses,
            mixed_batches=self.mixed,
        )
        if any(a.tenant is not None for a in arrivals):
            res.by_tenant = self._tenant_breakdown()
        if w.burst:
            self._burst_metrics(res, *w.burst)
        return res

    def _tenant_breakdown(self) -> dict[str, dict]:
        """Per tenant: offered and in-SLO rows/s over capacity, goodput (in-SLO share
        of its rows), p99 latency, and the outcomes of its requests."""
        arrivals, D, cap = self.w.arrivals, self.w.duration, self.curve.capacity
        lat: dict[str, list[float]] = {}
        rows: dict[str, list[int]] = {}  # offered, in time, routed
        for i, a in enumerate(arrivals):
            name = a.tenant or "default"
            lat.setdefault(name, []).append(self.finish[i] - a.origin)
            r = rows.setdefault(name, [0, 0, 0])
            r[0] += a.rows
            r[1] += a.rows if self.outcome[i] == IN_TIME else 0
            r[2] += a.rows if self.outcome[i] == ROUTED else 0
        return {
            name: {
                "offered_share": r[0] / D / cap,
                "good_share": r[1] / D / cap,
                "goodput": r[1] / r[0] if r[0] else 1.0,
                "routed_rows": r[2],
                "p99_ms": _percentile(sorted(lat[name]), 0.99) * 1e3,
            }
            for name, r in sorted(rows.items())
        }

    def _burst_metrics(self, res: RunResult, b0: float, b1: float) -> None:
        arrivals = self.w.arrivals
        good = sum(
            a.rows for i, a in enumerate(arrivals) if b0 <= a.origin < b1 and self.outcome[i] == IN_TIME
        )
        res.burst_goodput_rows_s = good / (b1 - b0)
        # Recovery: from the end of the burst until every later window of produce time
        # is answered within SLO again (RECOVERY_OK of its requests).
        nwin = max(1, math.ceil((self.w.duration - b1) / RECOVERY_WINDOW))
        tot, ok = [0] * nwin, [0] * nwin
        for i, a in enumerate(arrivals):
            if a.origin >= b1:
                k = min(int((a.origin - b1) / RECOVERY_WINDOW), nwin - 1)
                tot[k] += 1
                ok[k] += self.outcome[i] == IN_TIME
        last_bad = -1
        for k in range(nwin):
            if tot[k] and ok[k] < RECOVERY_OK * tot[k]:
                last_bad = k
        res.recovery_s = (last_bad + 1) * RECOVERY_WINDOW
        res.recovery_censored = last_bad == nwin - 1


def simulate(
    workload: Workload,
    curve: Curve,
    policy: str | PolicySpec,
    cfg: SimConfig | None = None,
    tuned: tuple[int, float] | None = None,
) -> RunResult:
    """Run one policy over one workload and measure it."""
    spec = policy if isinstance(policy, PolicySpec) else policy_spec(policy, curve, tuned)
    sim = _Sim(workload, curve, spec, cfg or SimConfig())
    sim.run()
    return sim.result()


# ---------------------------------------------------------------------------- static-tuned
TUNE_ROWS = (16, 32, 64, 128, 256, 512)
TUNE_DELAYS_MS = (0.5, 1.0, 2.0, 5.0, 10.0)
TUNE_REQUESTS = 10_000


def tune_static(
    curve: Curve,
    *,
    rows: RowsDist | str = DEFAULT_ROWS,
    seed: int = 1,
    duration: float | None = None,
    load: float = 0.5,
    cfg: SimConfig | None = None,
    grid_rows: Sequence[int] = TUNE_ROWS,
    grid_delays_ms: Sequence[float] = TUNE_DELAYS_MS,
) -> tuple[tuple[int, float], list[tuple[int, float, float]]]:
    """The static config (rows, linger s) with the lowest p99 at `load` on Poisson
    arrivals, by grid search. The grid keeps a positive linger: with a linger of zero
    static is greedy with a row cap, already in every comparison. Default duration:
    5 s, or less on fast curves (about TUNE_REQUESTS requests per configuration)."""
    if isinstance(rows, str):
        rows = RowsDist.parse(rows)
    if duration is None:
        duration = min(5.0, TUNE_REQUESTS * rows.mean / (load * curve.capacity))
    workload = make_workload("poisson", curve, load=load, duration=duration, rows=rows, seed=seed)
    table: list[tuple[int, float, float]] = []
    best: tuple[float, int, float] | None = None
    for r in grid_rows:
        if r > curve.max_batch_rows:
            continue
        for d_ms in grid_delays_ms:
            spec = PolicySpec(f"static:{r}:{d_ms:g}", "static", {"max_batch_rows": r, "max_queue_delay": d_ms / 1e3}, {})
            res = simulate(workload, curve, spec, cfg)
            table.append((r, d_ms, res.p99_ms))
            key = (res.p99_ms, -r, d_ms)
            if best is None or key < (best[0], -best[1], best[2]):
                best = (res.p99_ms, r, d_ms)
    assert best is not None
    return (best[1], best[2] / 1e3), table


# ---------------------------------------------------------------------------- reporting
def format_table(results: Sequence[RunResult]) -> str:
    """A fixed-width table; extra columns appear when a scenario has them."""
    has_burst = any(r.burst_goodput_rows_s is not None for r in results)
    has_prio = any(len(r.p99_by_priority_ms) > 1 for r in results)
    head = ["policy", "load", "p50ms", "p99ms", "p99.9ms", "thru/cap", "good/cap",
            "batch", "miss%", "in_time", "late", "routed", "busy%"]
    if has_burst:
        head += ["burst_good/cap", "recovery_s"]
    if has_prio:
        head += ["p99_hi_ms", "p99_lo_ms"]
    rows = []
    for r in results:
        row = [
            r.policy,
            "-" if r.load is None else f"{r.load:g}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.p999_ms:.1f}",
            f"{r.throughput_rows_s / r.capacity_rows_s:.3f}",
            f"{r.goodput_share:.3f}",
            f"{r.mean_batch_rows:.0f}",
            f"{100 * r.slo_miss_rate:.2f}",
            str(r.outcomes["in_time"]),
            str(r.outcomes["scored_late"]),
            str(r.outcomes["routed_late"]),
            f"{100 * r.utilization:.0f}",
        ]
        if has_burst:
            if r.burst_goodput_rows_s is None:
                row += ["-", "-"]
            else:
                rec = f"{'>=' if r.recovery_censored else ''}{r.recovery_s:.1f}"
                row += [f"{r.burst_goodput_rows_s / r.capacity_rows_s:.3f}", rec]
        if has_prio:
            pr = r.p99_by_priority_ms
            row += [f"{pr.get(0, float('nan')):.1f}", f"{pr.get(1, float('nan')):.1f}"]
        rows.append(row)
    widths = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(wd) if i else h.ljust(wd) for i, (h, wd) in enumerate(zip(head, widths, strict=True)))]
    for row in rows:
        lines.append("  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- comparison
@dataclass
class Comparison:
    """Every policy over one scenario (and each load, where loads apply)."""

    curve: Curve
    scenario: str
    results: list[RunResult]
    tuned: tuple[int, float] | None = None
    tune_table: list[tuple[int, float, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        c = self.curve
        return {
            "curve": {"name": c.name, "a_ms": c.a * 1e3, "b_ms_per_row": c.b * 1e3,
                      "max_batch_rows": c.max_batch_rows, "capacity_rows_s": c.capacity,
                      "slo_ms": {str(k): v * 1e3 for k, v in c.slo.items()}, "source": c.source},
            "scenario": self.scenario,
            "static_tuned": None if self.tuned is None else {
                "max_batch_rows": self.tuned[0], "max_queue_delay_ms": self.tuned[1] * 1e3,
                "grid_p99_ms": [{"rows": r, "delay_ms": d, "p99_ms": p} for r, d, p in self.tune_table],
            },
            "results": [r.to_dict() for r in self.results],
        }


def compare(
    curve: Curve,
    scenario: str,
    policies: Sequence[str],
    *,
    loads: Sequence[float] = (0.5,),
    duration: float | None = None,
    rows: str = DEFAULT_ROWS,
    seed: int = 1,
    cfg: SimConfig | None = None,
    tune_duration: float | None = None,
    hop_ms: tuple[float, float] | None = None,
) -> Comparison:
    """Run each policy on the same arrivals (per load) and collect the results;
    hop_ms (p50, p99): the Kafka hop before the worker (with_hops)."""
    cfg = cfg or SimConfig(seed=seed)
    steady = is_steady(scenario)
    dur = duration if duration is not None else default_duration(scenario)
    # Arrivals first: a bad scenario or duration fails before the grid search runs.
    workloads = [
        make_workload(scenario, curve, load=load or 0.0, duration=dur, rows=rows, seed=seed, hop_ms=hop_ms)
        for load in (loads if steady else (None,))
    ]
    tuned, table = None, []
    if "static-tuned" in policies:
        tuned, table = tune_static(curve, rows=rows, seed=seed, duration=tune_duration, cfg=cfg)
    specs = [policy_spec(p, curve, tuned) for p in policies]
    results = [simulate(w, curve, spec, cfg) for w in workloads for spec in specs]
    return Comparison(curve, scenario, results, tuned, table)
