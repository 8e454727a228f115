"""Per-tenant-class figures over a window, for `tidebatch status` (pipeline/commands/
status.py), from two snapshots of a worker's metrics or from Prometheus: the
arithmetic of pipeline/ops/stats.py applied to the series of pipeline/observe/tenant_metrics.py.

Per class: the rate of outcomes (requests/s), its share used and served (its recent
rate and its recent rows taken into batches over its guaranteed rate: at the newer
snapshot, or averaged over the window from Prometheus; the highest of its workers'),
goodput (requests scored in time over every outcome of the class in the window: ok,
late, routed_late), p99 of the scored ones against the class's SLA, and the rows
throttled: over the class's share (yellow, queued below every in-share request) and over
its ceiling (red: queued last, shed or scored late, as the class's `beyond` says), with
the rows shed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from pipeline.ops.stats import Samples, _bucket_deltas, _delta, _series, histogram_quantile

ROWS = "tidebatch_tenant_rows_total"
SHED = "tidebatch_tenant_shed_rows_total"
REQUESTS = "tidebatch_tenant_requests_total"
LATENCY = "tidebatch_tenant_latency_seconds"
SLO = "tidebatch_tenant_slo_seconds"
USED = "tidebatch_tenant_share_used"
SERVED = "tidebatch_tenant_share_served"


@dataclass(frozen=True)
class TenantStats:
    """One tenant class over one window; None where the window has no data."""

    tenant_class: str
    rate_rps: float | None  # outcomes per second
    goodput: float | None  # in [0, 1]
    p99_ms: float | None
    slo_ms: float | None
    over_share_rows: float  # yellow
    over_ceiling_rows: float  # red
    shed_rows: float
    share_used: float | None = None  # recent rate / guaranteed rate; None without a share
    share_served: float | None = None  # recent rows taken into batches / guaranteed rate

    @property
    def throttled_rows(self) -> float:
        return self.over_share_rows + self.over_ceiling_rows

    @property
    def over_sla(self) -> bool:
        return self.p99_ms is not None and self.slo_ms is not None and self.p99_ms > self.slo_ms

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["throttled_rows"] = self.throttled_rows
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}


def _classes(samples: Samples, pipeline: str) -> list[str]:
    names = {dict(labels).get("tenant_class") for name in (ROWS, REQUESTS, SLO) for labels in _series(samples, name, pipeline)}
    return sorted(n for n in names if n)


def tenant_window_stats(old: Samples | None, new: Samples, seconds: float, pipeline: str) -> list[TenantStats]:
    """Per class of `pipeline`, between snapshots `old` and `new` taken `seconds` apart
    (workers' snapshots merged first, pipeline/ops/stats.py merge). Without `old`:
    totals since start, and no rate."""
    out = []
    for name in _classes(new, pipeline):
        def this(labels: dict[str, str], name: str = name) -> bool:
            return labels.get("tenant_class") == name

        def colour(c: str, name: str = name) -> float:
            return _delta(old, new, ROWS, pipeline, lambda lb: this(lb) and lb.get("colour") == c)

        outcomes = _delta(old, new, REQUESTS, pipeline, this)
        ok = _delta(old, new, REQUESTS, pipeline, lambda lb: this(lb) and lb.get("outcome") == "ok")
        p99 = histogram_quantile(0.99, _bucket_deltas(old, new, LATENCY, pipeline, this))

        def gauge(metric: str, this=this) -> float | None:
            """The class's gauge at the newer snapshot (merged by max, stats.py merge)."""
            values = [v for labels, v in _series(new, metric, pipeline).items() if this(dict(labels))]
            return max(values) if values else None

        slo = gauge(SLO)
        out.append(TenantStats(
            tenant_class=name,
            rate_rps=outcomes / seconds if old is not None and seconds > 0 else None,
            goodput=ok / outcomes if outcomes > 0 else None,
            p99_ms=None if p99 is None else p99 * 1000.0,
            slo_ms=None if slo is None else slo * 1000.0,
            over_share_rows=colour("yellow"),
            over_ceiling_rows=colour("red"),
            shed_rows=_delta(old, new, SHED, pipeline, this),
            share_used=gauge(USED),
            share_served=gauge(SERVED),
        ))
    return out


# ----------------------------------------------------------------------------- Prometheus
def tenant_queries(sel: str, window: str) -> dict[str, str]:
    """PromQL per (pipeline, tenant_class), the equivalent of tenant_window_stats."""
    by = "sum by (pipeline, tenant_class)"

    def inc(metric: str, match: str = "") -> str:
        return f"{by} (increase({metric}{{{sel}{match}}}[{window}]))"

    return {
        "rate": f"{by} (rate({REQUESTS}{{{sel}}}[{window}]))",
        "outcomes": inc(REQUESTS),
        "ok": inc(REQUESTS, ',outcome="ok"'),
        "p99": f"histogram_quantile(0.99, sum by (pipeline, tenant_class, le) (rate({LATENCY}_bucket{{{sel}}}[{window}])))",
        "slo": f"max by (pipeline, tenant_class) ({SLO}{{{sel}}})",
        "yellow": inc(ROWS, ',colour="yellow"'),
        "red": inc(ROWS, ',colour="red"'),
        "shed": inc(SHED),
        # Each worker's mean over the window, the highest worker's (as the merge does).
        "used": f"max by (pipeline, tenant_class) (avg_over_time({USED}{{{sel}}}[{window}]))",
        "served": f"max by (pipeline, tenant_class) (avg_over_time({SERVED}{{{sel}}}[{window}]))",
    }


def from_prom_values(values: dict[str, dict[str, float | None]]) -> list[TenantStats]:
    """tenant class -> {query key of tenant_queries -> value} -> TenantStats."""
    out = []
    for name, v in sorted(values.items()):
        outcomes, ok, p99, slo = v.get("outcomes"), v.get("ok"), _number(v.get("p99")), v.get("slo")
        out.append(TenantStats(
            tenant_class=name,
            rate_rps=v.get("rate"),
            goodput=(ok or 0.0) / outcomes if outcomes else None,
            p99_ms=None if p99 is None else p99 * 1000.0,
            slo_ms=None if slo is None else slo * 1000.0,
            over_share_rows=v.get("yellow") or 0.0,
            over_ceiling_rows=v.get("red") or 0.0,
            shed_rows=v.get("shed") or 0.0,
            share_used=_number(v.get("used")),
            share_served=_number(v.get("served")),
        ))
    return out


def _number(v: float | None) -> float | None:
    """A Prometheus value, None where it has none (absent, or NaN: an empty histogram)."""
    return None if v is None or math.isnan(v) else v


def format_tenants(pipeline: str, tenants: list[TenantStats]) -> list[str]:
    """The lines `tidebatch status` prints under the pipelines' table."""
    if not tenants:
        return []

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = ("TENANT CLASS", "RATE", "SHARE USED / SERVED", "GOODPUT", "P99 / SLA", "ROWS OVER SHARE / CEILING",
            "SHED ROWS")
    rows = [head] + [(
        f"{pipeline}/{t.tenant_class}",
        f"{num(t.rate_rps, ',.1f')} req/s",
        f"{num(t.share_used, '.2f')} / {num(t.share_served, '.2f')}",
        f"{num(None if t.goodput is None else 100 * t.goodput, '.2f')} %",
        f"{num(t.p99_ms, ',.1f')} / {num(t.slo_ms, '.0f')} ms" + (" OVER" if t.over_sla else ""),
        f"{t.over_share_rows:,.0f} / {t.over_ceiling_rows:,.0f}",
        f"{t.shed_rows:,.0f}",
    ) for t in tenants]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
