"""One small threaded HTTP server per worker (stdlib only):

    /metrics     Prometheus text from the worker's own registry
    /healthz     liveness: 200 while the worker's threads run (pipeline/ops/health.py)
    /readyz      readiness: 200 when partitions are assigned, the model is loaded and
                 the broker answered a poll recently; 503 + JSON reason otherwise
    /api/stats   JSON for the dashboard: a rolling window of per-pipeline statistics
    /model       GET: the model version serving; POST /model/reload: load the newest
                 version now (pipeline/versions/manager.py), answered when it serves
                 (200) or was refused (409, with the one-line reason)
    /            the built-in dashboard (pipeline/ops/static/)

It binds cfg.metrics.host:cfg.metrics.port (127.0.0.1 by default; port 0 picks a free
one). With cfg.metrics.auth set, everything but the probes (and /metrics, unless
protect_metrics) needs basic auth or the bearer token (pipeline/ops/http_auth.py);
without it, a server bound beyond loopback logs one warning at start. With
cfg.metrics.tls it speaks HTTPS only (pipeline/ops/http_tls.py), and `url` says
https; credentials sent beyond loopback without it get a warning too. Handlers only
read worker state and the registry, which are thread-safe to read; nothing here can
block the source or executor threads.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from prometheus_client.exposition import choose_encoder

from consumers.secret_values import scrub
from pipeline.errors import UserError, config_key_error
from pipeline.ops import health
from pipeline.ops import stats as S
from pipeline.ops.http_auth import HttpAuth, cleartext_warning, exposure_warning
from pipeline.ops.http_tls import server_context
from pipeline.ops.window import StatsWindow

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}


class OpsServer:
    """Start with start(), stop with stop(); `url` is the base URL once started."""

    def __init__(
        self,
        worker: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        source_thread: threading.Thread | None = None,
        ready_poll_s: float = health.READY_POLL_S,
        stall_s: float = health.STALL_S,
        interval_s: float = 1.0,
        window_s: float = 300.0,
        smooth_s: float = 5.0,
    ) -> None:
        self.worker = worker
        self.host = host
        self.requested_port = port
        self.source_thread = source_thread
        self.ready_poll_s = ready_poll_s
        self.stall_s = stall_s
        self.registry = worker.metrics.registry
        # Resolved here, from the worker's own config, so no caller can start the
        # server without the credentials it was configured with.
        tls = worker.cfg.metrics.tls
        self.auth = HttpAuth.from_config(worker.cfg.metrics.auth, client_certs=tls.client_ca_file is not None)
        self.tls = server_context(tls, config_key_error) if tls.enabled else None
        self.window = StatsWindow(
            lambda: S.from_registry(self.registry),
            interval_s=interval_s, window_s=window_s, smooth_s=smooth_s,
        )
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._export_worker_gauges()

    def _export_worker_gauges(self) -> None:
        """The SLO and readiness as metrics, so Prometheus alerts and `tidebatch status`
        can compare p99 with the SLO and count ready workers."""
        m = self.worker.metrics
        m.slo.labels(m.pipeline).set(self.worker.cfg.batching.slo_ms / 1000.0)
        m.ready.labels(m.pipeline).set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
        queue = getattr(self.worker, "queue", None)
        if queue is not None:
            # pipeline/worker/core.py sets tidebatch_queue_rows only when records arrive, so an idle
            # worker would show the queue of its last burst forever: read it live.
            m.queue_rows.labels(m.pipeline).set_function(lambda: float(queue.rows))

    # ------------------------------------------------------------------ state
    def liveness(self) -> tuple[bool, dict[str, Any]]:
        return health.liveness(
            self.worker, time.monotonic(), stall_s=self.stall_s, source_thread=self.source_thread
        )

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        return health.readiness(self.worker, time.monotonic(), max_poll_age_s=self.ready_poll_s)

    def worker_info(self) -> dict[str, Any]:
        w = self.worker
        ready, _ = self.readiness()
        return {
            "pipeline": w.cfg.pipeline,
            "policy": w.cfg.batching.policy,
            "group_id": getattr(w, "group_id", w.cfg.group_id),
            "input_topic": getattr(w, "input_topic", w.cfg.input_topic),
            "provider": getattr(getattr(w, "session", None), "provider", None),
            "model_version": getattr(getattr(w, "model", None), "version", None),
            "assigned": [[t, p] for t, p in w.assigned],
            "started": w.started.is_set(),
            "ready": ready,
            "slo_ms": w.cfg.batching.slo_ms,
            "stats": _public_stats(w),
        }

    def stats_json(self) -> dict[str, Any]:
        return {"now": round(time.time(), 3), "worker": self.worker_info(), **self.window.as_json()}

    def metrics_body(self, accept: str) -> tuple[bytes, str]:
        """/metrics: the registry in the format the scraper accepts."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def model_answer(self, reload: bool) -> tuple[int, dict[str, Any]]:
        """GET /model: the serving version; POST /model/reload: load the newest now,
        answered when it serves (200) or was refused (409, with the one-line reason)."""
        worker = self.worker
        outcome = None
        if reload:
            versions = getattr(worker, "versions", None)
            outcome = None if versions is None else versions.reload()
        model = getattr(worker, "model", None)
        body: dict[str, Any] = {
            "pipeline": worker.cfg.pipeline,
            "model": getattr(model, "name", None),
            "version": getattr(model, "version", None),
            "path": str(getattr(model, "onnx_path", "")),
        }
        if outcome is not None:
            body["reload"] = outcome.as_dict()
        return (409 if outcome is not None and outcome.refused else 200), body

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ops server not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{'https' if self.tls is not None else 'http'}://{host}:{self.port}"

    def start(self) -> OpsServer:
        self._httpd = _bind(self.host, self.requested_port, self.tls)
        self._httpd.ops = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.25}, name="ops-http", daemon=True
        )
        self._thread.start()
        self.window.start()
        guarded = ""
        if self.auth is not None:
            open_paths = "/healthz /readyz" + ("" if self.auth.protect_metrics else " /metrics")
            guarded = f"; {' or '.join(self.auth.schemes())} auth needed on all but {open_paths}"
        log.info("ops endpoints on %s (/metrics /healthz /readyz /api/stats /)%s", self.url, guarded)
        for warning in (exposure_warning(self.host, self.auth), cleartext_warning(self.host, self.auth, self.tls)):
            if warning:
                log.warning(warning)
        return self

    def stop(self) -> None:
        self.window.stop()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> OpsServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _public_stats(worker: Any) -> dict[str, Any]:
    s = getattr(worker, "stats", None)
    if s is None:
        return {}
    keys = ("consumed", "scored", "scored_late", "routed_late", "dlq", "batches", "commits", "pauses")
    return {k: getattr(s, k, None) for k in keys}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls is not None:
            # No handshake here, in the accept loop: one client stalling mid-handshake
            # would keep every other from connecting. finish_request does it, in the
            # connection's own thread.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(_HANDSHAKE_S)
            try:
                request.do_handshake()
            except OSError as exc:  # ssl.SSLError too: plain HTTP, an untrusted client, a port scan
                log.debug("ops endpoints: TLS handshake with %s failed: %s", client_address[0], exc)
                return
            request.settimeout(None)  # as a plain connection: the handler reads blocking
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver would print a traceback to stderr for a connection that broke
        # mid-request (a client gone, a TLS alert): nothing an operator must act on.
        log.debug("ops endpoints: connection from %s failed", client_address[0], exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


_HANDSHAKE_S = 10.0  # a TLS client that has not finished its handshake by then is dropped


def _bind(host: str, port: int, tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    cls = _Server6 if ":" in host else _Server
    try:
        server = cls((host, port), _Handler)
        server.tls = tls
        return server
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UserError(
                f"metrics port {port} on {host} is already in use: set metrics.port "
                "(TIDEBATCH_METRICS__PORT, --metrics-port; 0 picks a free one)"
            ) from None
        raise UserError(f"cannot listen on {host}:{port} for metrics: {exc.strerror}") from None


class _Handler(BaseHTTPRequestHandler):
    server_version = "tidebatch-ops"

    @property
    def ops(self) -> OpsServer:
        return self.server.ops  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._handle(self._route)

    def do_POST(self) -> None:  # noqa: N802
        self._handle(self._post)

    def _handle(self, route: Callable[[str], None]) -> None:
        path = urlsplit(self.path).path
        try:
            auth = self.ops.auth
            if auth is not None and auth.protects(path) and not auth.allows(
                self.headers.get("Authorization"), client_cert=self._client_cert()
            ):
                self._send(401, _json({"error": "authentication required", "schemes": auth.schemes()}),
                           "application/json", [("WWW-Authenticate", c) for c in auth.challenges()])
                return
            route(path)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer
        except Exception as exc:  # never let a handler bug kill the server thread
            log.exception("ops endpoint %s failed", path)
            self._send(500, _json({"error": f"{type(exc).__name__}: {exc}"}), "application/json")

    def _client_cert(self) -> bool:
        """A client certificate was sent; the handshake verified it against
        metrics.tls.client_ca_file (CERT_OPTIONAL: one that does not verify fails it)."""
        conn = self.connection
        return isinstance(conn, ssl.SSLSocket) and bool(conn.getpeercert())

    def _route(self, path: str) -> None:
        if path == "/metrics":
            body, content_type = self.ops.metrics_body(self.headers.get("Accept", ""))
            self._send(200, body, content_type)
        elif path == "/healthz":
            ok, body = self.ops.liveness()
            self._send(200 if ok else 503, _json(body), "application/json")
        elif path == "/readyz":
            ok, body = self.ops.readiness()
            self._send(200 if ok else 503, _json(body), "application/json")
        elif path == "/api/stats":
            self._send(200, _json(self.ops.stats_json()), "application/json")
        elif path == "/model":
            self._model(reload=False)
        elif path in ("/", "/index.html"):
            self._static("index.html")
        elif path.startswith("/static/"):
            self._static(path[len("/static/"):])
        else:
            self._send(404, _json({"error": f"no such endpoint: {path}"}), "application/json")

    def _post(self, path: str) -> None:
        if path == "/model/reload":
            self._model(reload=True)
        else:
            self._send(404, _json({"error": f"no such endpoint: POST {path}"}), "application/json")

    def _model(self, reload: bool) -> None:
        code, body = self.ops.model_answer(reload)
        self._send(code, _json(body), "application/json")

    def _static(self, name: str) -> None:
        # Only plain file names that exist in static/: no path can escape the folder.
        files = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()}
        target = files.get(name)
        if target is None:
            self._send(404, _json({"error": f"no such file: {name}"}), "application/json")
            return
        ctype = _CONTENT_TYPES.get(target.suffix, "application/octet-stream")
        self._send(200, target.read_bytes(), ctype)

    def _send(self, code: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.send_response(code)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s " + format, self.address_string(), *args)


def _json(obj: Any) -> bytes:
    # Endpoints are printed text too: a secret the process resolved is masked here as in
    # the logs (consumers/secret_values.py), whatever field a future change adds.
    return scrub(orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY).decode()).encode()
