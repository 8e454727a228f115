"""A rolling window of derived statistics for the dashboard (/api/stats).

Every `interval_s` the sampler snapshots the worker's registry and derives one point
per pipeline from the snapshot `smooth_s` earlier: rates and latency quantiles over
the last few seconds, smooth enough to read, recent enough to show a burst. The last
`window_s` of points are kept, so a freshly opened dashboard shows history at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pipeline.ops import stats as S

log = logging.getLogger(__name__)

SERIES = (
    "throughput_rps", "rows_per_s", "dlq_per_s", "p50_ms", "p99_ms",
    "batch_rows", "queue_rows", "lag", "assigned",
)


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
        self._points: deque[tuple[float, dict[str, S.PipelineStats]]] = deque(
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
            if base is None:
                point = S.window_stats(None, snap, 0.0)
            else:
                point = S.window_stats(base[1], snap, now - base[0])
            self._points.append((self._wall(), point))

    def latest(self) -> dict[str, S.PipelineStats]:
        with self._lock:
            return dict(self._points[-1][1]) if self._points else {}

    def as_json(self) -> dict[str, Any]:
        """{"interval_s", "window_s", "smooth_s", "pipelines": {name: {"slo_ms",
        "t": [unix s], <series>: [...]}}, "latest": {name: {...}}}: one array per
        series, aligned on "t"; null where a window had no data."""
        with self._lock:
            points = list(self._points)
        pipes: dict[str, dict[str, Any]] = {}
        for t, per_pipeline in points:
            for name, st in per_pipeline.items():
                d = st.as_dict()
                entry = pipes.setdefault(name, {"slo_ms": None, "t": [], **{k: [] for k in SERIES}})
                entry["t"].append(round(t, 3))
                for k in SERIES:
                    entry[k].append(d[k])
                if d["slo_ms"] is not None:
                    entry["slo_ms"] = d["slo_ms"]
        latest = {name: st.as_dict() for name, st in (points[-1][1].items() if points else [])}
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
