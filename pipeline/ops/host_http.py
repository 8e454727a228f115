"""The one ops port of `tidebatch run --processes N`: pipeline/ops/http.py's server and
handlers (so metrics.auth and metrics.tls apply to it as to a worker's), answering from
the children's loopback endpoints, merged by pipeline/ops/host_merge.py.

Each child listens on 127.0.0.1 on a free port behind a bearer token only the parent
has (pipeline/app/processes.py child_config); the parent asks them when it is asked,
a few children at once, each with a short timeout, so one stuck child shows as "no
answer" in the body instead of holding the probe.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from pipeline.ops import stats as S
from pipeline.ops.host_merge import (
    ChildView,
    host_liveness,
    host_readiness,
    host_worker_info,
    merge_metrics,
)
from pipeline.ops.http import OpsServer
from pipeline.ops.http_auth import HttpAuth
from pipeline.ops.http_config import MetricsConfig
from pipeline.ops.http_tls import server_context
from pipeline.ops.window import StatsWindow

CHILD_TIMEOUT_S = 2.0
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


class HostOpsServer(OpsServer):
    """`children()`: the supervisor's view of its children (index, pid, alive, port);
    `token`: what their loopback endpoints ask for; `supervisor_ok()`: False once the
    host is stopping for good."""

    def __init__(
        self,
        metrics: MetricsConfig,
        pipeline: str,
        children: Callable[[], list[ChildView]],
        token: str,
        supervisor_ok: Callable[[], bool] = lambda: True,
        *,
        model_host_stats: Callable[[], dict[str, Any]] | None = None,
        interval_s: float = 1.0,
        window_s: float = 300.0,
        smooth_s: float = 5.0,
    ) -> None:
        from pipeline.errors import config_key_error

        self.worker = None
        self.registry = None  # type: ignore[assignment]
        self.source_thread = None
        self.host = metrics.host
        self.requested_port = metrics.port
        self.pipeline = pipeline
        self.children = children
        self.supervisor_ok = supervisor_ok
        self.model_host_stats = model_host_stats
        self._authorization = f"Bearer {token}"
        self.auth = HttpAuth.from_config(metrics.auth, client_certs=metrics.tls.client_ca_file is not None)
        self.tls = server_context(metrics.tls, config_key_error) if metrics.tls.enabled else None
        self.window = StatsWindow(self._samples, interval_s=interval_s, window_s=window_s, smooth_s=smooth_s)
        self._httpd = None
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ops-children")

    # ------------------------------------------------------------------ children
    def _get(self, port: int, path: str) -> tuple[int, str]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={
            "Authorization": self._authorization, "Accept": TEXT_FORMAT})
        try:
            with urllib.request.urlopen(request, timeout=CHILD_TIMEOUT_S) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def _ask(self, path: str, method: str = "GET") -> list[tuple[ChildView, int | None, str]]:
        """Each child's (view, status, body); status None: no answer (body says why)."""
        views = self.children()

        def one(view: ChildView) -> tuple[ChildView, int | None, str]:
            if view.port is None or not view.alive:
                return view, None, "not running" if not view.alive else "starting: no ops port yet"
            try:
                if method == "POST":
                    req = urllib.request.Request(f"http://127.0.0.1:{view.port}{path}", method="POST", data=b"",
                                                 headers={"Authorization": self._authorization})
                    with urllib.request.urlopen(req, timeout=CHILD_TIMEOUT_S * 30) as resp:
                        return view, resp.status, resp.read().decode()
                status, body = self._get(view.port, path)
                return view, status, body
            except urllib.error.HTTPError as exc:
                return view, exc.code, exc.read().decode(errors="replace")
            except (OSError, ValueError) as exc:
                return view, None, f"no answer on its ops port {view.port}: {exc}"

        return list(self._pool.map(one, views))

    def _metrics_texts(self) -> list[tuple[int, str]]:
        return [(v.index, body) for v, status, body in self._ask("/metrics") if status == 200]

    def _samples(self) -> S.Samples:
        return S.merge(S.from_text(text) for _, text in self._metrics_texts())

    # ------------------------------------------------------------------ endpoints
    def metrics_body(self, accept: str) -> tuple[bytes, str]:
        views = self.children()
        own = (
            "# HELP tidebatch_host_processes Worker processes of this host (runtime.processes), by state.\n"
            "# TYPE tidebatch_host_processes gauge\n"
            f'tidebatch_host_processes{{pipeline="{self.pipeline}",state="running"}} '
            f"{float(sum(v.alive for v in views))}\n"
            f'tidebatch_host_processes{{pipeline="{self.pipeline}",state="configured"}} {float(len(views))}\n'
            "# HELP tidebatch_host_child_restarts_total Children restarted by the host's policy.\n"
            "# TYPE tidebatch_host_child_restarts_total counter\n"
            f'tidebatch_host_child_restarts_total{{pipeline="{self.pipeline}"}} {float(sum(v.restarts for v in views))}\n'
        )
        merged = merge_metrics(self._metrics_texts())
        return (merged + own + model_host_metrics(self.pipeline, self.model_host_stats)).encode(), TEXT_FORMAT

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        return host_liveness(self.children(), self.supervisor_ok())

    def _views(self) -> list[ChildView]:
        """The children with their /readyz and /api/stats answers."""
        ready = {v.index: (v, status, body) for v, status, body in self._ask("/readyz")}
        stats = {v.index: (status, body) for v, status, body in self._ask("/api/stats")}
        out = []
        for index, (view, status, body) in ready.items():
            if status in (200, 503):
                view.ready = (status == 200, _loads(body))
            else:
                view.error = body if status is None else f"/readyz answered HTTP {status}"
            s_status, s_body = stats.get(index, (None, ""))
            if s_status == 200:
                view.stats = _loads(s_body)
            out.append(view)
        return out

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        ok, body = host_readiness(self._views())
        if not self.supervisor_ok():
            ok, body = False, {**body, "ready": False, "reason": "the host is stopping"}
        return ok, body

    def worker_info(self) -> dict[str, Any]:
        views = self._views()
        ready, _ = host_readiness(views)
        return host_worker_info(views, ready and self.supervisor_ok())

    def model_answer(self, reload: bool) -> tuple[int, dict[str, Any]]:
        """GET: the first child's answer; POST: every child reloads (the host answers 409
        when any refused), the answers per process."""
        answers = self._ask("/model/reload", "POST") if reload else self._ask("/model")[:1]
        per = {str(v.index): (_loads(body) if status is not None else {"error": body}) for v, status, body in answers}
        first = next(iter(per.values()), {"error": "no process"})
        refused = any(status != 200 for _, status, _ in answers)
        body = {k: v for k, v in first.items() if k != "reload"}
        if reload:
            body["processes"] = per
        return (409 if refused and reload else 200 if not refused else 503), body

    def stop(self) -> None:
        super().stop()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _loads(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"error": text[:200]}
    return value if isinstance(value, dict) else {"value": value}


# The shared model host's counters (pipeline/runtime/host_runner.py COUNTERS), as
# Prometheus counters: how many calls the device got, and how many requests and rows
# joined ones carried (requests / calls: how much the host joined).
MODEL_HOST_COUNTERS = {
    "calls": "Model calls the shared model host made.",
    "requests": "Batches (one worker's request each) the shared model host ran.",
    "rows": "Rows the shared model host ran.",
    "joined_calls": "Calls that joined more than one worker's batch.",
    "one_by_one_reruns": "Joined calls ONNX Runtime refused, rerun batch by batch.",
}


def model_host_metrics(pipeline: str, stats: Callable[[], dict[str, Any]] | None) -> str:
    """Prometheus text of the shared model host's counters; empty without a host, and
    one `up 0` line while it does not answer (it may be restarting)."""
    if stats is None:
        return ""
    lines = ["# HELP tidebatch_model_host_up Whether the shared model host answered this scrape.",
             "# TYPE tidebatch_model_host_up gauge"]
    try:
        got = stats()
    except OSError:
        return "\n".join([*lines, f'tidebatch_model_host_up{{pipeline="{pipeline}"}} 0.0', ""])
    lines.append(f'tidebatch_model_host_up{{pipeline="{pipeline}"}} 1.0')
    for key, text in MODEL_HOST_COUNTERS.items():
        name = f"tidebatch_model_host_{key}_total"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} counter",
                  f'{name}{{pipeline="{pipeline}"}} {float(got.get(key, 0))}']
    return "\n".join([*lines, ""])
