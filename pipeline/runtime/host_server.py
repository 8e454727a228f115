"""The shared model host's listening side (model_host.py --listen): a Unix socket that
worker processes connect to, and one loop, on one thread, that reads every
connection's frames and runs their batches through the runner (host_runner.py).

One thread for both, not a reader thread per connection: handing each request from a
reader thread to the runner thread cost a thread wake-up and a GIL hand-over per
request (the round trip of a lone 64-row CTR batch grew by ~200 us over a model
process of its own, on 2 loaded cores). Here, whenever the model frees, the loop reads
every frame that arrived meanwhile (in socket order), then plans the next call.

Per connection (wire.py frames): OPEN {"model", "providers", "threads"} -> HELLO
{"handle", "provider", "input_names", "output_names", "pid"} or ERROR (one line),
answered from a thread of its own (a model loads for seconds; the others' batches run
meanwhile), so a client opens before it sends batches; SLOT frames hand over its
shared-memory slots (SCM_RIGHTS works on an accepted connection as on a socket pair);
RUN {"handle", "slot", "arrays"} is queued and answered in that connection's order
(with every other connection's, oldest first); STATS -> STATS {counters}. When a
connection closes, the sessions it opened lose a user.
"""

from __future__ import annotations

import logging
import mmap
import os
import selectors
import socket
import struct
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.runtime import wire
from pipeline.runtime.host_models import Models, SharedModel
from pipeline.runtime.host_runner import Request, Runner

log = logging.getLogger(__name__)
_STALL_S = 10.0


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

    def read_ready(self) -> bool:
        """Read the frames waiting on this connection (one at least: the loop saw it
        readable); False when it closed."""
        while True:
            try:
                kind, header, feeds, fds = wire.recv_frame(self.sock)
            except (wire.ChannelClosed, OSError, ValueError):
                return False
            self._frame(kind, header, feeds, fds)
            try:
                if not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    return False  # closed right after this frame
            except BlockingIOError:
                return True  # nothing more for now
            except OSError:
                return False

    def close(self) -> None:
        with self._send_lock:
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
            threading.Thread(target=self._open, args=(header,), name="model-open", daemon=True).start()
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
            try:
                feeds = wire.slot_arrays(self._slots[slot], header["arrays"])
            except (KeyError, TypeError, ValueError) as exc:  # a spec past the slot's end, a bad dtype
                return Request(self, model, error=f"bad RUN frame: {type(exc).__name__}: {exc}".splitlines()[0])
        return Request(self, model, feeds, header.get("packed"))

    def _open(self, header: dict[str, Any]) -> None:
        from pipeline.errors import UserError

        try:
            model = self.host.models.open(
                str(header["model"]), str(header.get("providers") or self.host.providers),
                int(header.get("threads") or self.host.threads), header.get("options"),
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
        """Accept, read and run, for ever: select (without waiting while requests are
        queued), read what arrived, run one call."""
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select(0 if self.runner.waiting() else None):
                if key.fileobj is listener:
                    sock, _ = listener.accept()
                    # A client that stalls mid-frame, or stops reading its answers,
                    # would stall every other: after this long it is dropped instead.
                    # Kernel timeouts, not settimeout(): that one would make the
                    # MSG_DONTWAIT peek in read_ready wait too.
                    stall = struct.pack("ll", int(_STALL_S), 0)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, stall)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, stall)
                    conn = Connection(sock, self)
                    selector.register(sock, selectors.EVENT_READ, conn)
                    with self._lock:
                        self.connections += 1
                        self._live.add(conn)
                elif not self._read(key.data):
                    selector.unregister(key.fileobj)
                    key.data.close()
                    with self._lock:
                        self._live.discard(key.data)
            call = self.runner.next_call(block=False)
            if call:
                self.runner.run_call(call)

    @staticmethod
    def _read(conn: Connection) -> bool:
        """The connection's waiting frames; False when it is to be closed. A frame
        this host cannot make sense of drops its connection (that worker's batches
        fail and it connects again), never the host and every other worker."""
        try:
            return conn.read_ready()
        except Exception as exc:  # noqa: BLE001 - one client's bad frame, whatever it raised
            log.error("dropping a connection after a frame it sent: %s", f"{type(exc).__name__}: {exc}".splitlines()[0])
            return False

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
