"""The shared model host's listening side (model_host.py --listen): a Unix socket that
worker processes connect to, a thread per connection that reads its frames, and the
one runner (host_runner.py) that runs every connection's batches.

Per connection (wire.py frames): OPEN {"model", "providers", "threads"} -> HELLO
{"handle", "provider", "input_names", "output_names", "pid"} or ERROR (one line),
answered at once, so a client opens before it sends batches; SLOT frames hand over its
shared-memory slots (SCM_RIGHTS works on an accepted connection as on a socket pair);
RUN {"handle", "slot", "arrays"} is queued and answered by the runner in that
connection's order (with every other connection's, oldest first); STATS -> STATS
{counters}. When a connection closes, the sessions it opened lose a user.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.runtime import wire
from pipeline.runtime.host_models import Models, SharedModel
from pipeline.runtime.host_runner import Request, Runner

log = logging.getLogger(__name__)


class Connection:
    """One client: its frames in, its answers out (under a lock: the runner and this
    connection's reader both send)."""

    def __init__(self, sock: socket.socket, host: Host) -> None:
        self.sock = sock
        self.host = host
        self.closed = False
        self._send_lock = threading.Lock()
        self._slots: dict[int, mmap.mmap] = {}
        self._models: dict[int, SharedModel] = {}
        self._opened: list[SharedModel] = []

    def send(self, kind: int, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> None:
        with self._send_lock:
            if self.closed:
                return
            try:
                wire.send_frame(self.sock, kind, header, arrays)
            except OSError:
                self.closed = True  # the worker is gone; its reader thread cleans up

    def serve(self) -> None:
        try:
            while True:
                try:
                    kind, header, feeds, fds = wire.recv_frame(self.sock)
                except (wire.ChannelClosed, OSError, ValueError):
                    return
                self._frame(kind, header, feeds, fds)
        finally:
            self.closed = True
            for model in self._opened:
                self.host.models.release(model)
            self.sock.close()

    def _frame(self, kind: int, header: dict[str, Any], feeds: dict[str, np.ndarray], fds: list[int]) -> None:
        if kind == wire.SLOT:
            for extra in fds[1:]:
                os.close(extra)
            if fds:
                # Replaced, not closed: a queued request may still hold views of it
                # (the mapping goes when the last view does).
                try:
                    self._slots[int(header["slot"])] = mmap.mmap(fds[0], int(header["size"]))
                finally:
                    os.close(fds[0])
        elif kind == wire.RUN:
            self.host.runner.submit(self._request(header, feeds))
        elif kind == wire.OPEN:
            self._open(header)
        elif kind == wire.STATS:
            self.send(wire.STATS, self.host.stats())
        else:
            self.send(wire.ERROR, {"error": f"unexpected frame kind {kind}"})

    def _request(self, header: dict[str, Any], feeds: dict[str, np.ndarray]) -> Request:
        model = self._models.get(header.get("handle", -1))
        if model is None:
            return Request(self, None, error=f"no model open with handle {header.get('handle')!r} on this connection")
        slot = header.get("slot")
        if slot is not None:
            if slot not in self._slots:
                return Request(self, model, error=f"no shared-memory slot {slot}")
            feeds = wire.slot_arrays(self._slots[slot], header["arrays"])
        return Request(self, model, feeds, header.get("packed"))

    def _open(self, header: dict[str, Any]) -> None:
        from pipeline.errors import UserError

        try:
            model = self.host.models.open(
                str(header["model"]), str(header.get("providers") or self.host.providers),
                int(header.get("threads") or self.host.threads),
            )
        except (UserError, OSError, KeyError, ValueError) as exc:
            text = str(exc) if isinstance(exc, UserError) else f"cannot open model: {type(exc).__name__}: {exc}"
            self.send(wire.ERROR, {"error": text.splitlines()[0] if text else "cannot open model"})
            return
        self._opened.append(model)
        self._models[model.handle] = model
        self.send(wire.HELLO, {**model.hello(), "pid": os.getpid()})


class Host:
    """The models, the runner and the listening socket of one shared model host."""

    def __init__(self, models: Models, runner: Runner, providers: str, threads: int) -> None:
        self.models = models
        self.runner = runner
        self.providers = providers
        self.threads = threads
        self.connections = 0
        self._lock = threading.Lock()
        self._live: set[Connection] = set()

    def serve_forever(self, listener: socket.socket) -> None:
        threading.Thread(target=self.runner.loop, name="model-runner", daemon=True).start()
        while True:
            sock, _ = listener.accept()
            conn = Connection(sock, self)
            threading.Thread(target=self._serve, args=(conn,), name="model-conn", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with self._lock:
            self.connections += 1
            self._live.add(conn)
        try:
            conn.serve()
        finally:
            with self._lock:
                self._live.discard(conn)

    def stats(self) -> dict[str, Any]:
        """What the supervisor's ops page shows: the runner's counters, whole and per
        open model, and the connections."""
        with self._lock:
            live = len(self._live)
        models = {
            str(m.handle): {"model": m.key[0], "users": m.users, "joins": m.no_join is None, **m.counts}
            for m in self.models.snapshot()
        }
        return {
            "pid": os.getpid(), "connections": live, "connections_total": self.connections,
            "sessions_opened": self.models.opened, "waiting": self.runner.waiting(),
            "max_rows": self.runner.max_rows, **self.runner.counts, "models": models,
        }
