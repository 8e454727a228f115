"""The shared model host's runner (model_host.py --listen): one per host, i.e. per
device, run by the host's loop (host_server.py), that runs the RUN requests of every
connected worker, oldest first.

Whenever the model frees, it takes the requests queued at that moment that can share
one call (coalesce.py: the oldest and those right behind it for the same model, up to
max_rows), concatenates their inputs, runs ONE session call, splits the outputs and
answers each connection its own rows. It never waits for more requests to arrive: a
lone request runs at once, exactly as in a model process of its own.

Each answer's RESULT header carries the call's own seconds, and how many requests and
rows the call held. The worker's cost model (pipeline/batching/cost.py) learns the
seconds: they are how long the worker's batch took to come back once the model took
it, which is what its deadlines need, even though other workers' rows shared the call
(a share of them would promise answers sooner than they come).

When a joined call fails (ONNX Runtime raised), its requests run again one by one so
that only the request the model refuses gets the error; if each of them then runs, the
join itself was the problem (a fixed batch size) and that model's requests are not
joined again. Likewise when the outputs do not split per row. Either is logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline.runtime import coalesce, wire, wire_values

log = logging.getLogger(__name__)


class Answers(Protocol):
    """A connection as the runner sees it: where a request's answer goes."""

    closed: bool

    def send(self, kind: int, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None: ...


class Model(Protocol):
    """A shared session as the runner sees it (host_models.py SharedModel)."""

    handle: int
    name: str
    no_join: str | None  # why its requests run one by one, once known
    counts: dict[str, int]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]: ...


@dataclass(slots=True)
class Request:
    """One RUN frame, waiting for the runner. error: answered with it, in its turn."""

    conn: Answers
    model: Model | None
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    packed: dict[str, list[Any]] | None = None
    error: str | None = None
    queued: coalesce.Queued = coalesce.Queued(-1, None)

    def __post_init__(self) -> None:
        rows = None if self.packed or self.model is None or self.error else coalesce.rows_of(self.feeds)
        self.queued = coalesce.Queued(self.model.handle if self.model else -1, rows)


COUNTERS = ("calls", "requests", "rows", "joined_calls", "joined_requests", "one_by_one_reruns")


class Runner:
    """The queue of RUN requests and the thread that runs them; `timer` gives seconds."""

    def __init__(self, max_rows: int, timer: Callable[[], float] = time.perf_counter) -> None:
        self.max_rows = max_rows
        self._timer = timer
        self._queue: deque[Request] = deque()
        self._cond = threading.Condition()
        self.counts = dict.fromkeys(COUNTERS, 0)
        self._noted: set[int] = set()

    def submit(self, request: Request) -> None:
        with self._cond:
            self._queue.append(request)
            self._cond.notify()

    def next_call(self, block: bool = True) -> list[Request]:
        """The requests of the next call (empty only when not blocking and none wait)."""
        with self._cond:
            while not self._queue:
                if not block:
                    return []
                self._cond.wait()
            n = coalesce.take((r.queued for r in self._queue), self.max_rows)
            return [self._queue.popleft() for _ in range(n)]

    def run_call(self, requests: list[Request]) -> None:
        live = [r for r in requests if not r.conn.closed]  # nobody would read the answer
        if len(live) > 1:
            self._joined(live)
        elif live:
            self._alone(live[0])

    def _joined(self, requests: list[Request]) -> None:
        model = requests[0].model
        assert model is not None
        feeds = [r.feeds for r in requests]
        why = model.no_join or coalesce.joinable(feeds)
        if why is not None:
            if model.no_join is None:
                self._note(model, f"its requests run one by one where they cannot be joined: {why}")
            for r in requests:
                self._alone(r)
            return
        rows = [r.queued.rows or 0 for r in requests]
        t0 = self._timer()
        try:
            outputs = model.run(coalesce.join(feeds))
        except Exception as exc:  # ORT's own types; maybe one request's bad batch
            failed = self._rerun(requests, model)
            if not failed:  # each ran alone: joining them is what failed
                first = f"{type(exc).__name__}: {exc}".splitlines()[0]
                self._stop_joining(model, f"a joined call of {sum(rows)} rows failed ({first})")
            return
        seconds = self._timer() - t0
        parts = coalesce.split(outputs, rows)
        if isinstance(parts, str):
            self._count(model, len(requests), sum(rows), joined=True)
            self._stop_joining(model, parts)
            self._rerun(requests, model)
            return
        self._count(model, len(requests), sum(rows), joined=True)
        header = {"seconds": seconds, "requests": len(requests), "rows": sum(rows), "packed": {}}
        for request, part in zip(requests, parts, strict=True):
            request.conn.send(wire.RESULT, header, part)

    def _rerun(self, requests: list[Request], model: Model) -> int:
        """A joined call's requests again, each alone; returns how many the model refused."""
        for counts in (self.counts, model.counts):
            counts["one_by_one_reruns"] = counts.get("one_by_one_reruns", 0) + 1
        return sum(not self._alone(r) for r in requests)

    def _stop_joining(self, model: Model, why: str) -> None:
        if model.no_join is None:
            model.no_join = why
            log.warning("model %s (handle %d): its requests run one by one from now on: %s", model.name, model.handle, why)

    def _note(self, model: Model, line: str) -> None:
        """One log line per model, the first time its requests cannot be joined."""
        if model.handle not in self._noted:
            self._noted.add(model.handle)
            log.warning("model %s (handle %d): %s", model.name, model.handle, line)

    def _alone(self, request: Request) -> bool:
        """Run one request and answer it; False when the model refused it."""
        if request.error is not None or request.model is None:
            request.conn.send(wire.ERROR, {"error": request.error or "no model"})
            return False
        t0 = self._timer()
        try:
            outputs = request.model.run(wire_values.unpack(request.feeds, request.packed))
            arrays, packed = wire_values.pack(outputs)
        except Exception as exc:  # ORT's own types: shape, dtype, kernel failures
            request.conn.send(wire.ERROR, {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
            return False
        seconds = self._timer() - t0
        rows = request.queued.rows or 0
        self._count(request.model, 1, rows, joined=False)
        request.conn.send(wire.RESULT, {"seconds": seconds, "requests": 1, "rows": rows, "packed": packed}, arrays)
        return True

    def _count(self, model: Model, requests: int, rows: int, joined: bool) -> None:
        for counts in (self.counts, model.counts):
            for key, n in (("calls", 1), ("requests", requests), ("rows", rows),
                           ("joined_calls", int(joined)), ("joined_requests", requests if joined else 0)):
                counts[key] = counts.get(key, 0) + n

    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)
