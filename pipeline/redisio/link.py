"""One Redis client per worker, shared by the feature hook, the score store and the
dedup hook, plus the outage state machine they all obey.

Outage behaviour (docs/REDIS.md "Outages"):
- A failed call (connection refused, timeout, error on connect) marks Redis *down*:
  one WARNING, `tidebatch_redis_up` 0, `tidebatch_redis_outages_total` +1.
- While down, callers skip Redis at once (`run()` returns None without touching the
  network), so a dead Redis costs a batch nothing after the call that found it dead.
- A monitor thread pings with exponential backoff (50 ms doubling to backoff_max_s,
  with jitter so a fleet of workers does not reconnect in step); the first PONG marks
  Redis *up* again: one INFO line, gauge 1. The worker is never restarted.
- redis-py's own retries are switched off (its default retries ten times with backoff,
  seconds of stall per batch against a dead server): this module is the retry policy.
- A rejected password or an untrusted certificate (failures.py) is handled like an
  outage (fail-open, the same retries) but logged as one ERROR line naming the cause,
  once per cause rather than per retry, and kept in `problem`, which makes the worker
  not ready (pipeline/ops/health.py) until a retry gets through.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry

from consumers.client_settings import resolve_secret
from pipeline.errors import config_key_error
from pipeline.redisio.config import RedisConfig, redacted_url, require_tls_files
from pipeline.redisio.failures import OUTAGE, classify, describe, first_line
from pipeline.redisio.metrics import RedisMetrics

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
_REFUSED_LOG_EVERY_S = 60.0
# Exceptions that mean "Redis is not reachable right now" (an outage). redis-py wraps
# socket errors in its ConnectionError/TimeoutError (AuthenticationError is one too);
# OSError covers anything that slips through (TLS).
UNAVAILABLE = (redis.ConnectionError, redis.TimeoutError, OSError)


def make_client(rc: RedisConfig, environ: Mapping[str, str] | None = None) -> redis.Redis:
    """A redis-py client with short timeouts, no hidden retries, str replies. Raises
    UserError naming the key when a configured TLS file is missing. `redis.password`
    may be `${ENV_VAR}` or `@file:/path`, like the `kafka:` block's secrets
    (consumers/client_settings.py), so a mounted Secret's rotation needs no config edit."""
    require_tls_files(rc, config_key_error)
    url, username, password = rc.connection()
    if rc.password is not None:
        password = resolve_secret("redis.password", rc.password, os.environ if environ is None else environ, "config key")
    kwargs: dict[str, Any] = {
        "socket_timeout": rc.socket_timeout_ms / 1000.0,
        "socket_connect_timeout": rc.connect_timeout_ms / 1000.0,
        "retry": Retry(NoBackoff(), 0),
        "decode_responses": True,
        "client_name": "tidebatch",
        "driver_info": None,  # no CLIENT SETINFO: one round trip less per (re)connect
        "health_check_interval": 0,
    }
    if password is not None:
        kwargs["password"] = password
    if username is not None:
        kwargs["username"] = username
    if url.startswith("rediss://"):
        # Verification stays on (redis-py: CERT_REQUIRED): a password sent to an
        # unverified server is a password given away.
        kwargs["ssl_check_hostname"] = rc.tls_check_hostname
        if rc.tls_ca_file:
            kwargs["ssl_ca_certs"] = rc.tls_ca_file
        if rc.tls_cert_file:
            kwargs["ssl_certfile"] = rc.tls_cert_file
            kwargs["ssl_keyfile"] = rc.tls_key_file
    pool = redis.ConnectionPool.from_url(url, **kwargs)
    return redis.Redis(connection_pool=pool)


class RedisLink:
    """A shared client and its up/down state. Thread-safe: executor threads, the score
    store's writer and the monitor use it concurrently."""

    def __init__(
        self,
        rc: RedisConfig,
        metrics: RedisMetrics,
        *,
        client: redis.Redis | None = None,
        backoff_min_s: float = BACKOFF_MIN_S,
    ) -> None:
        self.url = redacted_url(rc.effective_url())
        self.user = rc.connection()[1] or "default"
        self.client = client or make_client(rc)
        self.metrics = metrics
        self._backoff_min = backoff_min_s
        self._backoff_max = max(rc.backoff_max_s, backoff_min_s)
        self._lock = threading.Lock()
        self._up = False
        self._down_since: float | None = None
        self._failures = 0  # failed calls in the current outage
        self._logged_kind: str | None = None  # the cause last logged in this outage
        self._problem: str | None = None  # an AUTH or TLS failure's line, until up again
        self._next_refused_log = 0.0
        self._went_down = threading.Event()
        self._up_event = threading.Event()
        self._closed = threading.Event()
        self._monitor = threading.Thread(target=self._monitor_loop, name="redis-monitor", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RedisLink:
        """Ping once (so a worker started during an outage says so) and start the monitor."""
        try:
            self.client.ping()
            self._mark_up()
        except (*UNAVAILABLE, redis.RedisError) as exc:
            self.failed("connect", exc)
        self._monitor.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._went_down.set()  # wake the monitor so it sees _closed
        if self._monitor.is_alive():
            self._monitor.join(timeout=5)
        self.client.close()
        self.client.connection_pool.disconnect()

    # ------------------------------------------------------------------ calls
    @property
    def up(self) -> bool:
        return self._up

    @property
    def problem(self) -> str | None:
        """While the server rejects our credentials or TLS: why, in one line (no
        secrets). None while up, and during a plain outage (fail-open: still ready)."""
        return self._problem

    def wait_up(self, timeout: float) -> bool:
        """Block until Redis is up or `timeout` passes (for background writers)."""
        return self._up_event.wait(timeout)

    def run(self, op: str, build: Callable[[Pipeline], None]) -> list[Any] | None:
        """One pipelined round trip: `build` queues commands, the results come back in
        order (a command's error reply as an exception object in its slot). None when
        Redis is down (nothing is sent) or the call failed (then Redis is marked down)."""
        if not self._up:
            return None
        pipe = self.client.pipeline(transaction=False)
        build(pipe)
        if not len(pipe):
            return []
        try:
            return self.call(op, lambda _client: pipe.execute(raise_on_error=False))
        finally:
            pipe.reset()

    def call(self, op: str, fn: Callable[[redis.Redis], Any]) -> Any | None:
        """fn(client), or None when Redis is down (fn is not called) or fn failed with
        a connection/timeout/server error (then Redis is marked down)."""
        if not self._up:
            return None
        try:
            return fn(self.client)
        except UNAVAILABLE as exc:
            self.failed(op, exc)
            return None
        except redis.RedisError as exc:
            self.refused(op, exc)
            return None

    def refused(self, op: str, exc: BaseException) -> None:
        """An error reply (ACL, OOM, no scripting): Redis is up but said no. Counted;
        logged at most once a minute; not an outage, so no reconnect cycle."""
        self.metrics.errors.labels(op).inc()
        now = time.monotonic()
        if now >= self._next_refused_log:
            self._next_refused_log = now + _REFUSED_LOG_EVERY_S
            log.warning("redis at %s refused %s: %s", self.url, op, first_line(exc))

    def failed(self, op: str, exc: BaseException) -> None:
        """Count a failed call; the first failure of an outage logs and wakes the monitor."""
        self.metrics.errors.labels(op).inc()
        with self._lock:
            self._failures += 1
            already_down = not self._up and self._down_since is not None
            if not already_down:
                self._up = False
                self._up_event.clear()
                self._down_since = time.monotonic()
        self._explain(exc)
        if already_down:
            return
        self.metrics.up.set(0)
        self.metrics.outages.inc()
        # Sockets to a dead server are useless: drop the idle ones so the reconnect
        # attempt makes a fresh connection instead of failing on a stale one.
        self.client.connection_pool.disconnect(inuse_connections=False)
        self._went_down.set()

    def _explain(self, exc: BaseException) -> None:
        """Log why Redis is down, once per cause per outage: a monitor retrying a
        wrong password every 2 s must not write a line every 2 s. A plain failure after
        an AUTH/TLS one is silent and keeps the problem (until a retry gets through):
        a server refusing a missing client certificate alternates between a TLS alert
        and a bare EOF, which would otherwise log a line per retry and flap readiness."""
        kind = classify(exc)
        with self._lock:
            if kind == self._logged_kind or (kind == OUTAGE and self._problem is not None):
                return
            self._logged_kind = kind
            self._problem = None if kind == OUTAGE else describe(kind, exc, self.url, self.user)
        if self._problem is None:
            log.warning(
                "redis at %s unavailable (%s: %s): features default, score store buffers, "
                "dedup skipped; reconnecting with backoff",
                self.url, type(exc).__name__, first_line(exc),
            )
        else:
            log.error("%s; not ready, features default, retrying with backoff", self._problem)

    def _mark_up(self) -> None:
        with self._lock:
            was_down = self._down_since is not None
            down_for = time.monotonic() - self._down_since if was_down else 0.0
            failures = self._failures
            self._up = True
            self._up_event.set()
            self._down_since = None
            self._failures = 0
            self._logged_kind = None
            self._problem = None
        self.metrics.up.set(1)
        if was_down:
            log.info("redis at %s is back after %.1f s (%d failed calls); resuming", self.url, down_for, failures)

    # ------------------------------------------------------------------ reconnect
    def _monitor_loop(self) -> None:
        while not self._closed.is_set():
            self._went_down.wait()
            self._went_down.clear()
            delay = self._backoff_min
            while not self._up and not self._closed.is_set():
                if self._closed.wait(delay * random.uniform(0.8, 1.2)):
                    return
                try:
                    self.client.ping()
                except (*UNAVAILABLE, redis.RedisError) as exc:
                    self.metrics.errors.labels("reconnect").inc()
                    with self._lock:
                        self._failures += 1
                    self._explain(exc)  # silent unless the cause changed
                    delay = min(delay * 2, self._backoff_max)
                    continue
                self._mark_up()
