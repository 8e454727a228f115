"""The shared model host as its supervisor sees it: one process per device that every
worker process connects to (model_host.py --listen; the workers' side is
model_process.py's ProcessSession with an address).

    host = SharedModelHost(path, "auto", 1, 4096).start()   # listening when it returns
    host.alive(); host.stats(); host.restart(); host.stop()

The host runs in a session of its own (a terminal's Ctrl-C goes to the supervisor,
which stops it after its workers) and ends when the process that started it dies
(--parent: prctl PR_SET_PDEATHSIG when started from the main thread, and a watch on
its parent pid), so no host outlives a killed supervisor. Nothing is loaded at start: each model is loaded when a worker opens it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from pipeline.errors import UserError
from pipeline.runtime import wire
from pipeline.runtime.model_process import model_host_env

_START_TIMEOUT = 60.0  # s; the host imports numpy and ONNX Runtime, nothing more
_STOP_TIMEOUT = 10.0
_POLL = 0.05


class SharedModelHost:
    """Start, watch, restart and stop one shared model host listening at `address`
    (a Unix socket path, in a private directory of the supervisor's)."""

    def __init__(self, address: str, providers: str = "auto", intra_op_threads: int = 1, max_rows: int = 4096) -> None:
        self.address = address
        self.providers = providers
        self.intra_op_threads = intra_op_threads
        self.max_rows = max_rows
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._reader: wire.FrameReader | None = None
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> SharedModelHost:
        """Spawn the host and return once it accepts connections; a host that exits
        first is a one-line UserError."""
        env = model_host_env()
        cmd = [
            sys.executable, "-m", "pipeline.runtime.model_host", "--listen", self.address,
            "--providers", self.providers, "--intra-op-threads", str(self.intra_op_threads),
            "--max-rows", str(self.max_rows), "--parent", str(os.getpid()),
        ]
        if threading.current_thread() is threading.main_thread():
            cmd.append("--deathsig")  # model_host.py die_with: why only from the main thread
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address)  # a socket file left by a killed host looks like a listening one
        self._proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                raise UserError(f"the shared model host did not start: it exited with status {code}")
            with contextlib.suppress(FileNotFoundError, ConnectionRefusedError):
                self._connect()
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise UserError(f"the shared model host did not listen at {self.address} within {_START_TIMEOUT:.0f} s")
            time.sleep(_POLL)

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.address)
        except OSError:
            sock.close()
            raise
        self._close_link()
        self._sock, self._reader = sock, wire.FrameReader(sock)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def restart(self) -> SharedModelHost:
        self.stop()
        return self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; the workers' connections see EOF."""
        self._close_link()
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stats(self) -> dict[str, Any]:
        """The host's counters (host_server.py Host.stats): calls, requests, rows,
        joined calls, per open model. Raises OSError when the host does not answer."""
        with self._lock:
            for attempt in (1, 2):  # the link is made again once: the host may have restarted
                try:
                    if self._sock is None:
                        self._connect()
                    assert self._sock is not None and self._reader is not None
                    self._sock.settimeout(10.0)
                    wire.send_frame(self._sock, wire.STATS, {})
                    kind, header, _ = self._reader.read()
                    return header
                except (OSError, EOFError):
                    self._close_link()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def _close_link(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None

    def __enter__(self) -> SharedModelHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
