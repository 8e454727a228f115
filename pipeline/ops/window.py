"""A rolling window of derived statistics for the dashboard (/api/stats).

Every `interval_s` the sampler snapshots the worker's registry and derives one point
per pipeline from the snapshot `smooth_s` earlier: rates and latency quantiles over
the last few seconds, smooth enough to read, recent enough to show a burst. The last
`window_s` of points are kept, so a freshly opened dashboard shows history at once.
A pipeline with a `tenants:` section also gets one point per tenant class
(pipeline/ops/tenant_stats.py, the figures `tidebatch status` prints).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pipeline.ops import stats as S
from pipeline.ops.tenant_stats import TenantStats, tenant_window_stats

log = logging.getLogger(__name__)

SERIES = (
    "throughput_rps", "rows_per_s", "dlq_per_s", "p50_ms", "p99_ms",
    "batch_rows", "queue_rows", "lag", "assigned",
)
TENANT_SERIES = ("rate_rps", "goodput", "p99_ms", "share_used", "share_served")
Point = tuple[float, dict[str, S.PipelineStats], dict[str, list[TenantStats]]]


class StatsWindow:
    def __init__(
        self,
        collect: Callable[[], S.Samples],
        *,
        interval_s: float = 1.0,
        window_s: float = 300.0,
        smooth_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0 or window_s < interval_s or smooth_s < interval_s:
            raise ValueError("need 0 < interval_s <= smooth_s and interval_s <= window_s")
        self._collect = collect
        self.interval_s = interval_s
        self.window_s = window_s
        self.smooth_s = smooth_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._snaps: deque[tuple[float, S.Samples]] = deque()
        self._points: deque[Point] = deque(
            maxlen=max(int(window_s / interval_s), 1)
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Take one snapshot and derive one point (the sampler thread calls this)."""
        now = self._clock()
        snap = self._collect()
        with self._lock:
            # Keep the newest snapshot at least smooth_s old as the base of the window.
            while len(self._snaps) > 1 and now - self._snaps[1][0] >= self.smooth_s:
                self._snaps.popleft()
            base = self._snaps[0] if self._snaps else None
            self._snaps.append((now, snap))
            old, seconds = (None, 0.0) if base is None else (base[1], now - base[0])
            point = S.window_stats(old, snap, seconds)
            tenants = {p: t for p in point if (t := tenant_window_stats(old, snap, seconds, p))}
            self._points.append((self._wall(), point, tenants))

    def latest(self) -> dict[str, S.PipelineStats]:
        with self._lock:
            return dict(self._points[-1][1]) if self._points else {}

    def as_json(self) -> dict[str, Any]:
        """{"interval_s", "window_s", "smooth_s", "pipelines": {name: {"slo_ms",
        "t": [unix s], <series>: [...], "tenants": {class: {"slo_ms", <series>: [...]}}}},
        "latest": {name: {..., "tenants": [{...}, ...]}}}: one array per series, aligned
        on the pipeline's "t"; null where a window had no data (or the class had not
        appeared yet)."""
        with self._lock:
            points = list(self._points)
        pipes: dict[str, dict[str, Any]] = {}
        for t, per_pipeline, per_tenant in points:
            for name, st in per_pipeline.items():
                d = st.as_dict()
                entry = pipes.setdefault(name, {"slo_ms": None, "t": [], **{k: [] for k in SERIES}, "tenants": {}})
                entry["t"].append(round(t, 3))
                for k in SERIES:
                    entry[k].append(d[k])
                if d["slo_ms"] is not None:
                    entry["slo_ms"] = d["slo_ms"]
                _append_tenants(entry["tenants"], per_tenant.get(name, []), len(entry["t"]))
        latest: dict[str, dict[str, Any]] = {}
        if points:
            _, per_pipeline, per_tenant = points[-1]
            for name, st in per_pipeline.items():
                latest[name] = {**st.as_dict(), "tenants": [ts.as_dict() for ts in per_tenant.get(name, [])]}
        return {
            "interval_s": self.interval_s,
            "window_s": self.window_s,
            "smooth_s": self.smooth_s,
            "pipelines": pipes,
            "latest": latest,
        }

    # ------------------------------------------------------------------ thread
    def start(self) -> StatsWindow:
        self._thread = threading.Thread(target=self._run, name="ops-stats", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # a metrics bug must never take the worker down
                log.exception("stats sample failed")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _append_tenants(classes: dict[str, dict[str, Any]], stats: list[TenantStats], length: int) -> None:
    """One point per class, padded with nulls so every series is `length` long: a class
    first seen mid-window has nulls before, one gone quiet nulls after."""
    for ts in stats:
        entry = classes.setdefault(ts.tenant_class, {"slo_ms": None, **{k: [None] * (length - 1) for k in TENANT_SERIES}})
        d = ts.as_dict()
        for k in TENANT_SERIES:
            entry[k].append(d[k])
        if d["slo_ms"] is not None:
            entry["slo_ms"] = d["slo_ms"]
    for entry in classes.values():
        for k in TENANT_SERIES:
            entry[k].extend([None] * (length - len(entry[k])))
