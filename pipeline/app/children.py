"""`tidebatch run --processes N`: the supervisor of N worker processes on one host
(docs/OPERATIONS.md, "Many processes on one host"). The decisions are
pipeline/app/processes.py's; this module starts, watches, restarts and stops.

Each child is a whole `tidebatch run` started again with the same arguments and
environment (`python -m pipeline.cli run ...`), plus TIDEBATCH_CHILD_INDEX and the
rest of processes.py's CHILD_* variables: it parses the same configuration the same
way, so nothing is lost translating it, and it is a fresh interpreter (no thread,
lock or librdkafka state forked from the parent, which multiprocessing's fork would
copy; spawn would re-import the parent's __main__ and pickle the config, secrets
included). PR_SET_PDEATHSIG=SIGKILL is set between fork and exec, before the child
runs a line of Python, so a parent that dies, even by SIGKILL, takes its children with
it. Each child is in its own process group: a Ctrl-C reaches the parent only, which
forwards one SIGTERM to each.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline.app.processes import (
    CHILD_COUNT_ENV,
    CHILD_HOST_ID_ENV,
    CHILD_INDEX_ENV,
    CHILD_PORT_FILE_ENV,
    CHILD_TOKEN_ENV,
    EXIT_CONFIG,
    MODEL_HOST_ENV,
    RestartPolicy,
    describe_exit,
    host_exit_code,
)
from pipeline.ops.host_merge import ChildView

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
POLL_S = 0.2
KILL_WAIT_S = 5.0  # after SIGKILL, for the kernel to reap


class ModelHost(Protocol):
    """One model process serving every child (the runtime's SharedModelHost, once it
    is wired in); the children find it through TIDEBATCH_MODEL_HOST."""

    address: str
    pid: int | None

    def start(self) -> Any: ...
    def alive(self) -> bool: ...
    def restart(self) -> Any: ...
    def stop(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...


def _die_with_parent() -> None:
    """In the child between fork and exec: SIGKILL when the parent dies. The kernel
    sends it when the *thread* that forked the child ends, so every child is started
    from the main thread (start(), and check() called by run())."""
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# Looked up here, in the parent: the child, between fork and exec, only calls it.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl


@dataclass(frozen=True)
class ChildSeat:
    """A child's place on the host, from its environment: its index, and the file it
    tells the parent its ops port in."""

    index: int
    port_file: str | None
    count: int = 1  # the host's children

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ChildSeat | None:
        index = environ.get(CHILD_INDEX_ENV)
        if index is None:
            return None
        return cls(int(index), environ.get(CHILD_PORT_FILE_ENV), int(environ.get(CHILD_COUNT_ENV, "1")))

    def report(self, port: int, registry: Any) -> None:
        """The ops port, written whole (a rename) so the parent never reads half; the
        index as a gauge, so the child's own metrics say which process it is."""
        from prometheus_client import Gauge

        Gauge("tidebatch_process_index", "This worker's index among its host's processes (run --processes).",
              registry=registry).set(self.index)
        if self.port_file:
            tmp = Path(self.port_file + ".tmp")
            tmp.write_text(str(port))
            tmp.replace(self.port_file)


@dataclass
class Child:
    index: int
    port_file: Path
    proc: subprocess.Popen | None = None
    port: int | None = None
    restarts: int = 0

    def view(self) -> ChildView:
        if self.port is None and self.port_file.is_file():
            text = self.port_file.read_text().strip()
            self.port = int(text) if text.isdigit() else None
        alive = self.proc is not None and self.proc.poll() is None
        return ChildView(self.index, None if self.proc is None else self.proc.pid, alive, self.port, self.restarts)


class Supervisor:
    """`command`: how a child is started (its environment: `environ` + its CHILD_*
    variables); `clock`: seconds, for the restart policy; `drain_s`: how long a
    SIGTERMed child may take before it is killed."""

    def __init__(
        self,
        processes: int,
        command: Sequence[str],
        policy: RestartPolicy,
        drain_s: float,
        *,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        model_host: ModelHost | None = None,
    ) -> None:
        self.command = list(command)
        self.policy = policy
        self.drain_s = drain_s
        self.environ = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.model_host = model_host
        self.token = secrets.token_urlsafe(24)
        self.host_id = secrets.token_hex(6)
        self._dir = Path(tempfile.mkdtemp(prefix="tidebatch-host-"))
        self.children = [Child(i, self._dir / f"port-{i}") for i in range(processes)]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.stop_reason: str | None = None
        self.failed: tuple[int, str] | None = None  # (exit code, line) once the host gives up

    # ------------------------------------------------------------------ children
    def _spawn(self, child: Child) -> None:
        child.port_file.unlink(missing_ok=True)
        child.port = None
        env = {
            **self.environ,
            CHILD_INDEX_ENV: str(child.index),
            CHILD_COUNT_ENV: str(len(self.children)),
            CHILD_PORT_FILE_ENV: str(child.port_file),
            CHILD_HOST_ID_ENV: self.host_id,
            CHILD_TOKEN_ENV: self.token,
        }
        if self.model_host is not None:
            env[MODEL_HOST_ENV] = self.model_host.address
        child.proc = subprocess.Popen(self.command, env=env, preexec_fn=_die_with_parent, process_group=0)
        log.info("process %d started: pid %d", child.index, child.proc.pid)

    def views(self) -> list[ChildView]:
        with self._lock:
            return [c.view() for c in self.children]

    def ok(self) -> bool:
        return not self._stop.is_set()

    def start(self) -> Supervisor:
        if self.model_host is not None:
            self.model_host.start()
            log.info("model host %s started: pid %s", self.model_host.address, self.model_host.pid)
        with self._lock:
            for child in self.children:
                self._spawn(child)
        return self

    def stop(self, reason: str) -> None:
        """From a signal handler: the loop in run() forwards SIGTERM and drains."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()

    def check(self) -> None:
        """One look at the children (and the model host): a dead one is restarted or
        stops the host, as the policy says."""
        with self._lock:
            for child in self.children:
                code = None if child.proc is None else child.proc.poll()
                if code is None or self._stop.is_set():
                    continue
                what = f"process {child.index} (pid {child.proc.pid}) died: {describe_exit(code)}"
                again, why = self.policy.decide(self.clock(), code)
                if again:
                    log.warning("%s; %s", what, why)
                    child.restarts += 1
                    self._spawn(child)
                    continue
                line = f"{what}; {why}: the host stops"
                log.error(line)
                self.failed = (EXIT_CONFIG if code == EXIT_CONFIG else 1, line)
                self.stop(line)
                return
        host = self.model_host
        if host is not None and not self._stop.is_set() and not host.alive():
            log.warning("model host %s (pid %s) died: restarting it", host.address, host.pid)
            host.restart()

    def run(self) -> int:
        """Until a stop (a signal, or a child the policy gives up on): then SIGTERM to
        every child, their drain, and the worst exit status."""
        try:
            while not self._stop.wait(POLL_S):
                self.check()
            codes = self._drain()
        finally:
            if self.model_host is not None:
                self.model_host.stop()
        if self.failed is not None:
            return self.failed[0]
        return host_exit_code(codes)

    def _drain(self) -> list[int]:
        log.info("stopping %d processes (%s)", len(self.children), self.stop_reason)
        with self._lock:
            procs = [(c.index, c.proc) for c in self.children if c.proc is not None]
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.drain_s
        codes = []
        for index, proc in procs:
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                log.error("process %d (pid %d) still running %.0f s after SIGTERM: killed", index, proc.pid,
                          self.drain_s)
                proc.kill()
                code = proc.wait(timeout=KILL_WAIT_S)
            if code == -signal.SIGTERM:
                # Ended by the SIGTERM it was sent before its worker had set its handler
                # (a stop during start-up): nothing consumed, nothing lost.
                code = 0
            if code != 0:
                log.warning("process %d (pid %d) ended: %s", index, proc.pid, describe_exit(code))
            codes.append(code)
        return codes

    def close(self) -> None:
        """After run(), or after a start that failed half-way: no child outlives it."""
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait(timeout=KILL_WAIT_S)
        for child in self.children:
            child.port_file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._dir.rmdir()
