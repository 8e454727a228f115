"""Deadlines the worker keeps itself, whatever a client call does (issue 49).

librdkafka's blocking calls hold the thread that makes them: an exactly_once worker
whose cluster lost its quorum sat ~600 s in `send_offsets_to_transaction` although 30 s
was passed, wrote no line meanwhile, and did not act on SIGTERM for 4 min 45 s, since
Python runs a signal handler only in the main thread, between two bytecodes, i.e. after
that call returns. Two parts:

- `CallWatch`: the source thread marks each blocking client call with the deadline
  it passed (pipeline/delivery/transactions.py); `overdue` says which call has overrun
  it. /healthz reads it (pipeline/ops/health.py): a worker stuck in a call past its
  deadline is not alive, so an orchestrator restarts it; the watchdog logs it once.
- `Watchdog`: a thread that keeps time for the worker whatever its source thread is
  doing: it has the worker report an outage that starts while the source thread is
  held in a call (`report_outage`, pipeline/worker/core.py), learns of SIGTERM/SIGINT through the interpreter's signal
  wakeup fd (written by the C-level handler in whatever thread the signal lands, even
  while the main thread is inside librdkafka), asks the worker to stop at once, and,
  if the process is still running `exit_after_s` after a stop began (a signal, or a
  failure), logs one line and ends it with exit code 1. Nothing is committed then
  beyond what was: at-least-once replays the rest, an open transaction is aborted
  by the broker (docs/DELIVERY.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

EXIT_MARGIN_S = 4.0  # past drain_timeout_s: the final commit and the group leave


@dataclass(frozen=True)
class Call:
    name: str
    started: float
    deadline_s: float


class CallWatch:
    """The blocking client call the source thread is in, if any. `clock`: monotonic."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._call: Call | None = None

    @contextmanager
    def call(self, name: str, deadline_s: float) -> Iterator[None]:
        """Mark `name` as running until the block ends; `deadline_s`: how long it may."""
        self._call = Call(name, self.clock(), deadline_s)
        try:
            yield
        finally:
            self._call = None

    @property
    def current(self) -> Call | None:
        """The call running now, if any."""
        return self._call

    def overdue(self, now: float) -> str | None:
        """A line on the call that has overrun its deadline, or None."""
        call = self._call
        if call is None or now - call.started <= call.deadline_s:
            return None
        return f"Kafka call {call.name} has run {now - call.started:.0f} s, past its {call.deadline_s:.0f} s deadline"


class Watchdog:
    """worker: has stop(reason), `stopping`, and optionally `calls` (a CallWatch) and
    report_outage(now). exit_after_s: how long after a stop began the process may
    still run."""

    def __init__(
        self,
        worker: Any,
        exit_after_s: float,
        *,
        exit: Callable[[int], None] = os._exit,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float = 0.5,
    ) -> None:
        self.worker = worker
        self.exit_after_s = exit_after_s
        self._exit = exit
        self.clock = clock
        self.tick_s = tick_s
        self._stop_began: float | None = None
        self._reported: str | None = None
        self._closed = threading.Event()
        self._read_fd: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        """Take the signal wakeup fd (main thread only) and start watching."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._read_fd = read_fd
        self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._read_fd], [], [], self.tick_s)
            if ready:
                for signum in os.read(self._read_fd, 64):  # type: ignore[arg-type]
                    self.signalled(signum)
            self.check()

    def signalled(self, signum: int) -> None:
        """A signal arrived (it may not reach the main thread for a long time)."""
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.worker.stop(f"signal {signal.Signals(signum).name}")

    def check(self) -> None:
        """Log a call past its deadline once; end a process that overstays its stop."""
        now = self.clock()
        report = getattr(self.worker, "report_outage", None)
        if report is not None:
            report(now)
        calls = getattr(self.worker, "calls", None)
        overdue = calls.overdue(now) if calls is not None else None
        if overdue and overdue.split(" has run")[0] != self._reported:
            self._reported = overdue.split(" has run")[0]
            log.error("%s: the worker is not alive until it returns (/healthz 503)", overdue)
        elif not overdue:
            self._reported = None
        if not getattr(self.worker, "stopping", False):
            return
        if self._stop_began is None:
            self._stop_began = now
        elif now - self._stop_began > self.exit_after_s:
            why = f" ({overdue})" if overdue else ""
            # The process's last line: when a failure stopped it, say which (a worker
            # whose credentials were refused cannot deliver what it has in flight, so
            # its drain runs out here and this line, not the failure's, ends the log).
            failure = getattr(self.worker, "failure", None)
            cause = f"; it stopped on error: {failure}" if failure else ""
            log.error(
                "still running %.0f s after the stop began%s: exiting now with nothing more committed%s",
                now - self._stop_began, why, cause,
            )
            for handler in logging.getLogger().handlers:
                with contextlib.suppress(Exception):  # a closed stream must not keep us alive
                    handler.flush()
            self._exit(1)
