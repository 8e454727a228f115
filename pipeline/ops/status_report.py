"""What `tidebatch status` (pipeline/commands/status.py) reports: per pipeline its
throughput, p99 against the SLO, mean batch, lag and a verdict, from the workers' /metrics
scraped twice (the dashboard's arithmetic, pipeline/ops/stats.py) or from Prometheus."""

from __future__ import annotations

import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import UserError
from pipeline.ops import stats as S
from pipeline.ops.http_client import OpsClient, Unreachable
from pipeline.ops.tenant_stats import (
    TenantStats,
    format_tenants,
    from_prom_values,
    tenant_queries,
    tenant_window_stats,
)


@dataclass
class PipelineReport:
    pipeline: str
    stats: S.PipelineStats | None
    workers_up: int
    verdict: str
    reasons: list[str] = field(default_factory=list)
    tenants: list[TenantStats] = field(default_factory=list)  # with a `tenants:` section

    def as_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "workers_up": self.workers_up,
            "verdict": self.verdict,
            "reasons": self.reasons,
            **(self.stats.as_dict() if self.stats else {}),
            "tenants": [t.as_dict() for t in self.tenants],
        }

    def add_tenants(self, tenants: list[TenantStats]) -> None:
        """A tenant class over its own SLA degrades a serving pipeline."""
        self.tenants = tenants
        over = [f"tenant class {t.tenant_class} p99 {t.p99_ms:.1f} ms over its {t.slo_ms:g} ms SLA"
                for t in tenants if t.over_sla]
        if over and self.verdict == S.OK:
            self.verdict = S.DEGRADED
        if self.verdict == S.DEGRADED:
            self.reasons += over


@dataclass
class StatusReport:
    pipelines: list[PipelineReport]
    down: dict[str, str]  # worker URL or instance -> why

    @property
    def ok(self) -> bool:
        return bool(self.pipelines) and all(p.verdict == S.OK for p in self.pipelines) and not self.down

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "pipelines": [p.as_dict() for p in self.pipelines], "down": self.down}


# ----------------------------------------------------------------------------- workers
def metrics_url(url: str) -> str:
    """http://host:port -> http://host:port/metrics; a bare host:port gets http://."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"not a worker metrics URL: {url!r} (expected http[s]://HOST:PORT[/metrics])")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _scrape_all(urls: list[str], client: OpsClient) -> dict[str, S.Samples | str]:
    """url -> Samples, or url -> error text; a UserError (a 401) propagates."""

    def one(url: str) -> S.Samples | str:
        try:
            return S.from_text(client.get(url, "worker"))
        except Unreachable as exc:
            return str(exc)
        except ValueError as exc:
            return f"not Prometheus text: {exc}"

    with ThreadPoolExecutor(max_workers=min(len(urls), 16)) as pool:
        return dict(zip(urls, pool.map(one, urls), strict=True))


def from_workers(
    urls: list[str], interval: float, lag_min: float = 100.0, client: OpsClient | None = None
) -> StatusReport:
    client = client or OpsClient()
    first = _scrape_all(urls, client)
    t0 = time.monotonic()
    time.sleep(max(interval, 0.0))
    second = _scrape_all(urls, client)
    seconds = time.monotonic() - t0
    up = {u: (first[u], second[u]) for u in urls if not isinstance(first[u], str) and not isinstance(second[u], str)}
    # The later error wins: it says how the worker is now.
    down = {u: r for u in urls for r in (first[u], second[u]) if isinstance(r, str)}
    return report_from_snapshots(up, seconds, down, lag_min)


def report_from_snapshots(
    up: dict[str, tuple[S.Samples, S.Samples]],
    seconds: float,
    down: dict[str, str],
    lag_min: float = 100.0,
) -> StatusReport:
    """Pure part of from_workers: snapshots pairs of reachable workers -> report."""
    by_pipeline: dict[str, list[tuple[S.Samples, S.Samples]]] = {}
    for old, new in up.values():
        for p in S.pipelines(new):
            by_pipeline.setdefault(p, []).append((old, new))
    reports = []
    for p, pairs in sorted(by_pipeline.items()):
        old = S.merge(o for o, _ in pairs)
        new = S.merge(n for _, n in pairs)
        st = S.window_stats(old, new, seconds).get(p)
        old_lag = S.window_stats(None, old, 0.0).get(p)
        growing = st is not None and S.lag_growing(old_lag.lag if old_lag else None, st, lag_min)
        report = _judge(p, st, len(pairs), growing)
        report.add_tenants(tenant_window_stats(old, new, seconds, p))
        reports.append(report)
    if not reports:
        reports.append(PipelineReport("?", None, 0, S.DOWN, ["no worker answers"]))
    return StatusReport(reports, down)


def _judge(pipeline: str, st: S.PipelineStats | None, workers_up: int, growing: bool) -> PipelineReport:
    if st is None:
        return PipelineReport(pipeline, None, workers_up, S.DOWN, ["no metrics for this pipeline"])
    verdict, reasons = S.verdict(st, growing, workers_up)
    return PipelineReport(pipeline, st, workers_up, verdict, reasons)


# ----------------------------------------------------------------------------- Prometheus
def _queries(window: str, job: str) -> dict[str, str]:
    sel = f'job="{job}"'
    w = window
    rate = lambda m: f"sum by (pipeline) (rate({m}{{{sel}}}[{w}]))"  # noqa: E731
    quantile = lambda q: (  # noqa: E731
        f"histogram_quantile({q}, sum by (pipeline, le) "
        f"(rate(tidebatch_end_to_end_latency_seconds_bucket{{{sel}}}[{w}])))"
    )
    return {
        "throughput_rps": rate("tidebatch_records_total"),
        "dlq_per_s": f'sum by (pipeline) (rate(tidebatch_records_total{{{sel},outcome="dlq"}}[{w}]))',
        "rows_per_s": rate("tidebatch_batch_rows_sum"),
        "batches_per_s": rate("tidebatch_batch_rows_count"),
        "p50": quantile(0.5),
        "p99": quantile(0.99),
        "slo": f"max by (pipeline) (tidebatch_slo_seconds{{{sel}}})",
        "queue_rows": f"sum by (pipeline) (tidebatch_queue_rows{{{sel}}})",
        "lag": f"sum by (pipeline) (tidebatch_pipeline_lag_messages{{{sel}}})",
        "lag_before": f"sum by (pipeline) (tidebatch_pipeline_lag_messages{{{sel}}} offset {w})",
        "assigned": f"sum by (pipeline) (tidebatch_assigned_partitions{{{sel}}})",
        "ready": f"sum by (pipeline) (tidebatch_ready{{{sel}}})",
        "workers": f"count by (pipeline) (tidebatch_assigned_partitions{{{sel}}})",
    }


def prom_query(
    base: str, query: str, client: OpsClient | None = None
) -> list[tuple[dict[str, str], float | None]]:
    """Instant query -> [(labels, value)]; NaN/Inf come back as None."""
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        doc = json.loads((client or OpsClient()).get(url, "Prometheus"))
    except Unreachable as exc:
        raise UserError(f"cannot query Prometheus at {base}: {exc}") from None
    if doc.get("status") != "success":
        raise UserError(f"Prometheus rejected {query!r}: {doc.get('error', doc)}")
    out = []
    for item in doc["data"]["result"]:
        value = float(item["value"][1])
        out.append((item["metric"], None if value != value or value in (float("inf"), float("-inf")) else value))
    return out


def from_prometheus(
    base: str, job: str, window: str, lag_min: float = 100.0, client: OpsClient | None = None
) -> StatusReport:
    if "://" not in base:
        base = "http://" + base
    values: dict[str, dict[str, float | None]] = {}
    for key, q in _queries(window, job).items():
        for labels, v in prom_query(base, q, client):
            values.setdefault(labels.get("pipeline", "?"), {})[key] = v
    down = {
        labels.get("instance", "?"): "Prometheus cannot scrape it (up == 0)"
        for labels, _ in prom_query(base, f'up{{job="{job}"}} == 0', client)
    }
    tenants: dict[str, dict[str, dict[str, float | None]]] = {}
    for key, q in tenant_queries(f'job="{job}"', window).items():
        for labels, v in prom_query(base, q, client):
            if "tenant_class" in labels:
                tenants.setdefault(labels.get("pipeline", "?"), {}).setdefault(labels["tenant_class"], {})[key] = v
    reports = [_prom_pipeline(p, v, lag_min) for p, v in sorted(values.items())]
    for report in reports:
        report.add_tenants(from_prom_values(tenants.get(report.pipeline, {})))
    if not reports:
        reports.append(PipelineReport("?", None, 0, S.DOWN, [f'no tidebatch metrics for job "{job}"']))
    return StatusReport(reports, down)


def _prom_pipeline(p: str, v: dict[str, float | None], lag_min: float) -> PipelineReport:
    ms = lambda x: None if x is None else x * 1000.0  # noqa: E731
    rows, batches = v.get("rows_per_s"), v.get("batches_per_s")
    st = S.PipelineStats(
        throughput_rps=v.get("throughput_rps"),
        rows_per_s=rows,
        dlq_per_s=v.get("dlq_per_s"),
        p50_ms=ms(v.get("p50")),
        p99_ms=ms(v.get("p99")),
        slo_ms=ms(v.get("slo")),
        batch_rows=rows / batches if rows is not None and batches else None,
        queue_rows=v.get("queue_rows") or 0.0,
        lag=v.get("lag"),
        assigned=v.get("assigned") or 0.0,
        ready=v.get("ready"),
    )
    growing = S.lag_growing(v.get("lag_before"), st, lag_min)
    return _judge(p, st, int(v.get("workers") or 0), growing)


# ----------------------------------------------------------------------------- output
def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def format_report(report: StatusReport) -> str:
    header = ("PIPELINE", "WORKERS", "THROUGHPUT", "P99 / SLO", "BATCH", "LAG", "VERDICT")
    rows = [header]
    for p in report.pipelines:
        st = p.stats
        rows.append((
            p.pipeline,
            str(p.workers_up) + (f" ({_num(st.ready, 0)} ready)" if st and st.ready is not None else ""),
            f"{_num(st.throughput_rps if st else None)} req/s",
            f"{_num(st.p99_ms if st else None)} / {_num(st.slo_ms if st else None, 0)} ms",
            f"{_num(st.batch_rows if st else None)} rows",
            _num(st.lag if st else None, 0),
            p.verdict + (f" ({'; '.join(p.reasons)})" if p.reasons else ""),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    for p in report.pipelines:
        lines += format_tenants(p.pipeline, p.tenants)
    lines += [f"down: {where}: {why}" for where, why in sorted(report.down.items())]
    return "\n".join(lines)
