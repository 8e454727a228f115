"""Fetching writer schemas off the decoding thread (pipeline/codecs/schema_wire.py).

The worker's source thread decodes every request; a registry call there (up to the
client's timeout, repeated while the registry is down) would stop every other
request with it, those of known ids included. So the codec hands the fetch of an id it
has not seen to SchemaFetcher, which runs it on a thread of its own, retried with a
growing pause (RETRY_FIRST_S doubling up to RETRY_MAX_S) until it succeeds, while the
request waits in the worker, bounded by its deadline (pipeline/worker/waiting.py).

A fetch is the codec's deserializer run on the waiting record: it fetches what decoding
that schema needs (the schema, and for Avro its references) into the client's cache,
which keeps it for good. How it ended decides:
- it returned, or failed on the record rather than the registry (a payload its schema
  does not read): the id is known; the decode says what is wrong, if anything;
- HTTP 404 from the registry: refused, "schema id 12 is not in the schema registry",
  for FORGET_REFUSAL_S (an id registered later is found after that);
- any other registry answer, or no answer (connection refused, timeout, TLS): retried;
  the last error is the reason a request dead-lettered at its deadline gives.

The thread runs while some fetch is pending and ends when none is; the clock is
passed in, and `step()` runs one round, so tests drive it without a thread or sleeps.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from consumers.secret_values import scrub

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.1
RETRY_MAX_S = 2.0
FORGET_REFUSAL_S = 60.0

KNOWN, RETRY, REFUSED = "known", "retry", "refused"


@dataclass(slots=True)
class _Pending:
    fetch: Callable[[], object]
    next_try: float
    attempts: int = 0
    error: str | None = None


def classify(key: str, exc: BaseException | None) -> tuple[str, str | None]:
    """How one fetch of `key` ended: (KNOWN | RETRY | REFUSED, the one-line reason)."""
    if exc is None:
        return KNOWN, None
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError):
        text = one_line(f"HTTP {exc.http_status_code}: {exc.error_message}")
        if exc.http_status_code == 404:
            return REFUSED, f"{key} is not in the schema registry ({text})"
        return RETRY, text
    if _unanswered(exc):
        return RETRY, one_line(f"{type(exc).__name__}: {exc}")
    return KNOWN, None  # fetched; the record itself is at fault, and its decode will say how


def _unanswered(exc: BaseException) -> bool:
    """The registry did not answer: no connection, a timeout, TLS, a broken response.
    confluent-kafka's client speaks through httpx2 where it is installed, else httpx
    (its common/_httpx_compat.py): the errors of both count."""
    return isinstance(exc, _transport_errors())


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    import importlib

    found: list[type[BaseException]] = [OSError, TimeoutError]
    for name in ("httpx", "httpx2", "httpcore"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        base = getattr(module, "HTTPError", None) or getattr(module, "NetworkError", None)
        if isinstance(base, type):
            found.append(base)
    return tuple(found)


def one_line(text: str, limit: int = 240) -> str:
    return scrub(" ".join(text.split()))[:limit]


class SchemaFetcher:
    """Writer schemas by key ("schema id 12"): known, being fetched, or refused.
    `known` and `refusal` are read on the decoding thread without waiting."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, thread: bool = True) -> None:
        self.clock = clock
        self._threaded = thread
        self._cond = threading.Condition()
        self._known: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        self._refused: dict[str, tuple[str, float]] = {}  # key -> (reason, forgotten at)
        self._thread: threading.Thread | None = None

    def known(self, key: str) -> bool:
        return key in self._known

    def refusal(self, key: str) -> str | None:
        refused = self._refused.get(key)
        if refused is None:
            return None
        if self.clock() >= refused[1]:
            self._refused.pop(key, None)
            return None
        return refused[0]

    def trouble(self, key: str) -> str:
        pending = self._pending.get(key)
        if pending is None or pending.error is None:
            return "no answer yet"
        return f"{pending.attempts} attempts, the last: {pending.error}"

    def failing(self, key: str) -> bool:
        pending = self._pending.get(key)
        return pending is not None and pending.error is not None

    def fetch(self, key: str, fetch: Callable[[], object]) -> None:
        """Fetch `key` by calling `fetch` until it succeeds; nothing if it is known or
        being fetched already."""
        with self._cond:
            if key in self._known or key in self._pending:
                return
            self._pending[key] = _Pending(fetch, self.clock())
            if self._threaded and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="schema-fetch", daemon=True)
                self._thread.start()
            self._cond.notify()

    def step(self) -> float | None:
        """Run every fetch that is due once. Returns the seconds until the next one is
        due, or None when nothing is pending."""
        now = self.clock()
        with self._cond:
            due = [(k, p) for k, p in self._pending.items() if p.next_try <= now]
        for key, pending in due:
            try:
                pending.fetch()
                error: BaseException | None = None
            except Exception as exc:  # classified below: the registry's answer or the record's fault
                error = exc
            self._settle(key, pending, *classify(key, error))
        with self._cond:
            if not self._pending:
                return None
            return max(min(p.next_try for p in self._pending.values()) - self.clock(), 0.0)

    def _settle(self, key: str, pending: _Pending, outcome: str, reason: str | None) -> None:
        with self._cond:
            if outcome == RETRY:
                if pending.error is None:
                    log.warning("schema registry: cannot fetch %s (%s); retrying while its requests wait", key, reason)
                pending.attempts += 1
                pending.error = reason
                pending.next_try = self.clock() + min(RETRY_FIRST_S * 2 ** (pending.attempts - 1), RETRY_MAX_S)
                return
            del self._pending[key]
            if outcome == KNOWN:
                self._known.add(key)
                if pending.error is not None:
                    log.info("schema registry: fetched %s after %d failed attempts", key, pending.attempts)
            else:
                self._refused[key] = (reason or f"{key} is not in the schema registry", self.clock() + FORGET_REFUSAL_S)

    def _run(self) -> None:
        while True:
            wait = self.step()
            with self._cond:
                if wait is None and not self._pending:
                    self._thread = None
                    return
                if wait is not None and wait > 0:
                    self._cond.wait(wait)
