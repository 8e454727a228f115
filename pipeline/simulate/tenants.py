"""The simulator's tenant scenario (issue 24): three steady tenants with a 30 % share
of capacity each, sending STEADY of capacity each (default 0.3: exactly their share),
and a fourth with a 10 % share sending FACTOR times its share
(`--scenario tenants[:FACTOR[:STEADY[:spiky]]]`, default tenants:2:0.3, 110 % in all).
With `spiky`, steady-a sends its load in spikes (SPIKE_ON of every SPIKE_PERIOD at
SPIKE_PERIOD/SPIKE_ON times it), its mean unchanged: what a bucket deep enough for
Poisson noise at the share lets one tenant do to the others (`--tenant-burst-ms`).

Three runs on the same curve and policy, side by side:
- single: one tenant, Poisson at the same total load (the batch size to keep);
- shared: the tenants' arrivals through one shared queue (no tenant gate);
- tenants: the same arrivals through the tenant gate (pipeline/batching/tenants.py),
  each class's guaranteed rate its share of the curve's capacity and its bucket one
  SLO budget deep (or `--tenant-burst-ms` of its rate, as a class's burst_ms in the
  worker): the burst a class may send at once is what the pipeline can absorb within
  one deadline, so the sum over the classes still fits one deadline.

Each tenant's SLA is the curve's budget unless `--tenant-slo NAME=MS,...` gives it one
of its own; goodput and in_slo are then counted against that tenant's own SLA, and its
requests' deadlines (so EDF order and expiry) follow it in both the shared and the gated
run, as a `tenants:` class's slo_ms does in the worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pipeline.batching.tenants import TenantClass
from pipeline.errors import UserError
from pipeline.simulate.arrivals import Arrival, poisson_arrivals
from pipeline.simulate.curves import Curve
from pipeline.simulate.engine import SimConfig, simulate
from pipeline.simulate.results import RunResult
from pipeline.simulate.rows import DEFAULT_ROWS, RowsDist
from pipeline.simulate.specs import policy_spec
from pipeline.simulate.workload import Workload, make_workload

STEADY_SHARE = 0.3
STEADY = ("steady-a", "steady-b", "steady-c")
BURSTER, BURSTER_SHARE = "burster", 0.1
DEFAULT_FACTOR = 2.0
DEFAULT_DURATION = 10.0
SPIKY, SPIKE_ON, SPIKE_PERIOD = "steady-a", 0.1, 0.3  # the spiky variant's spiking tenant
SHARES = {**dict.fromkeys(STEADY, STEADY_SHARE), BURSTER: BURSTER_SHARE}


def is_tenants(scenario: str) -> bool:
    return scenario.split(":")[0] == "tenants"


def scenario_loads(scenario: str) -> tuple[float, float]:
    """tenants -> (2, 0.3); tenants:5 -> (5, 0.3); tenants:5:0.28[:spiky] -> (5, 0.28)."""
    parts = scenario.split(":")
    try:
        factor = float(parts[1]) if len(parts) > 1 else DEFAULT_FACTOR
        steady = float(parts[2]) if len(parts) > 2 else STEADY_SHARE
    except ValueError:
        factor = steady = -1.0
    if parts[0] != "tenants" or len(parts) > 4 or parts[3:] not in ([], ["spiky"]) or factor <= 0 or steady <= 0:
        raise UserError(
            f"bad scenario {scenario!r}; use tenants[:FACTOR[:STEADY[:spiky]]] (the burster's load "
            "over its share, the steady tenants' load over capacity, both > 0; spiky: steady-a in spikes)"
        )
    return factor, steady


def is_spiky(scenario: str) -> bool:
    return scenario.split(":")[3:] == ["spiky"]


def offered(factor: float, steady: float) -> dict[str, float]:
    """Each tenant's load, relative to capacity."""
    return {name: share * factor if name == BURSTER else steady for name, share in SHARES.items()}


def tenant_workload(
    curve: Curve,
    factor: float,
    duration: float,
    rows: RowsDist | str = DEFAULT_ROWS,
    seed: int = 1,
    steady: float = STEADY_SHARE,
    spiky: bool = False,
) -> Workload:
    """Each tenant a Poisson process of its own (its own seed), merged in time; spiky:
    SPIKY's process on for SPIKE_ON of every SPIKE_PERIOD, at its mean over the period."""
    if isinstance(rows, str):
        rows = RowsDist.parse(rows)
    if duration <= 0:
        raise UserError("--duration must be > 0")
    arrivals: list[Arrival] = []
    loads = offered(factor, steady)
    for k, (name, load) in enumerate(loads.items()):
        segments = [(0.0, duration, load)]
        if spiky and name == SPIKY:
            starts = [i * SPIKE_PERIOD for i in range(math.ceil(duration / SPIKE_PERIOD))]
            segments = [(t, min(duration, t + SPIKE_ON), load * SPIKE_PERIOD / SPIKE_ON) for t in starts]
        for a in poisson_arrivals(segments, rows, curve.capacity, seed + 1000 * k):
            arrivals.append(replace(a, tenant=name))
    arrivals.sort(key=lambda a: a.t)
    name = f"tenants:{factor:g}:{steady:g}" + (":spiky" if spiky else "")
    return Workload(name, arrivals, duration, sum(loads.values()))


def parse_tenant_slo(spec: str | None) -> dict[str, float]:
    """'steady-a=30,burster=200' -> {tenant: SLA in seconds}; names from SHARES."""
    out: dict[str, float] = {}
    for part in (spec or "").split(","):
        if not part.strip():
            continue
        name, _, ms = part.partition("=")
        try:
            value = float(ms)
        except ValueError:
            value = -1.0
        if name.strip() not in SHARES or value <= 0:
            raise UserError(f"bad --tenant-slo {part!r}; use NAME=MS with NAME one of {', '.join(SHARES)} and MS > 0")
        out[name.strip()] = value / 1000.0
    return out


def tenant_slo_s(curve: Curve, slo: Mapping[str, float] | None, name: str) -> float:
    """A tenant's SLA in seconds: its own, else the curve's budget (priority 0)."""
    return slo[name] if slo and name in slo else curve.budget(0)


def tenant_classes(
    curve: Curve,
    shares: Mapping[str, float] = SHARES,
    slo: Mapping[str, float] | None = None,
    burst_s: float | None = None,
) -> dict[str, TenantClass]:
    """A class per tenant: rate = share × capacity, depth = rate × burst_s (default its
    SLA, as a class without burst_ms in the worker, pipeline/config/tenants.py)."""
    return {
        name: TenantClass(name, rate=share * curve.capacity,
                          depth=share * curve.capacity * (burst_s or tenant_slo_s(curve, slo, name)))
        for name, share in shares.items()
    }


@dataclass
class TenantComparison:
    curve: Curve
    scenario: str
    runs: dict[str, RunResult]  # single, shared, tenants
    slo: dict[str, float] = field(default_factory=dict)  # tenant -> own SLA, seconds
    burst_s: float | None = None  # every class's bucket depth in seconds of its rate; None: its SLA

    def to_dict(self) -> dict:
        return {"scenario": self.scenario, "shares": SHARES, "tenant_slo_s": self.slo, "burst_s": self.burst_s,
                "runs": {k: r.to_dict() for k, r in self.runs.items()}}


def compare_tenants(
    curve: Curve,
    scenario: str,
    *,
    policy: str = "adaptive",
    duration: float | None = None,
    rows: str = DEFAULT_ROWS,
    seed: int = 1,
    cfg: SimConfig | None = None,
    slo: Mapping[str, float] | None = None,
    burst_s: float | None = None,
) -> TenantComparison:
    """slo: tenant -> its own SLA in seconds (parse_tenant_slo); others the curve's.
    burst_s: every class's bucket depth in seconds of its rate (default its SLA)."""
    if burst_s is not None and burst_s <= 0:
        raise UserError("--tenant-burst-ms must be > 0")
    cfg = replace(cfg or SimConfig(seed=seed), tenant_slo=dict(slo) if slo else None)
    factor, steady = scenario_loads(scenario)
    dur = duration if duration is not None else DEFAULT_DURATION
    mixed = tenant_workload(curve, factor, dur, rows, seed, steady, is_spiky(scenario))
    assert mixed.load is not None
    single = make_workload("poisson", curve, load=mixed.load, duration=dur, rows=rows, seed=seed)
    spec = policy_spec(policy, curve)
    runs = {
        "single": simulate(single, curve, spec, cfg),
        "shared": simulate(mixed, curve, spec, replace(cfg, tenants=None)),
        "tenants": simulate(mixed, curve, spec, replace(cfg, tenants=tenant_classes(curve, SHARES, slo, burst_s))),
    }
    return TenantComparison(curve, mixed.name, runs, dict(slo or {}), burst_s)


def format_tenant_table(comp: TenantComparison) -> str:
    """One line per run and tenant; the single run has one line, for all rows."""
    head = ["run", "tenant", "share", "sla_ms", "offered", "good/cap", "goodput%", "p99ms", "in_slo", "batch", "mixed%"]
    lines = []
    for run, r in comp.runs.items():
        per = r.by_tenant or {"(all)": {
            "offered_share": r.produced_rows / r.duration_s / r.capacity_rows_s,
            "good_share": r.goodput_share,
            "goodput": r.goodput_rows_s * r.duration_s / r.produced_rows if r.produced_rows else 1.0,
            "p99_ms": r.p99_ms,
        }}
        for name, t in per.items():
            share = SHARES.get(name)
            slo_ms = tenant_slo_s(comp.curve, comp.slo, name) * 1e3
            lines.append([
                run, name, "-" if share is None else f"{share:g}", f"{slo_ms:g}", f"{t['offered_share']:.3f}",
                f"{t['good_share']:.3f}", f"{100 * t['goodput']:.2f}", f"{t['p99_ms']:.1f}",
                "yes" if t["p99_ms"] <= slo_ms else "NO", f"{r.mean_batch_rows:.0f}",
                f"{100 * r.mixed_batches / r.batches:.0f}" if r.batches and r.by_tenant else "-",
            ])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    out = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
           for row in [head, *lines]]
    return "\n".join(out)
