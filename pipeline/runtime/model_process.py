"""ONNX Runtime in a process of its own, so the model never waits for the GIL.

Why: in one process, every batch's ONNX Runtime call releases the GIL and must take
it back when it returns, from the source thread (polling, decoding) or the publisher.
On two cores a 495-row CTR batch took 1.70-1.76 ms inside the worker against 1.36 ms
alone, and the executor's core sat waiting: a backlog of binary requests drained at
~67 % of the model's own peak while the worker used ~1.4 of its 2 cores. In its own
process the model runs exactly as it does alone (the same session options, one batch
at a time), and through a backlog several batches are in flight (`runtime.executors`,
pipeline/batching/depth.py): the next batch is already waiting in its socket while the
worker's threads take the GIL back for the last.

The worker's executors call ``run_timed`` as they would an in-process session; the
process runs the batches in the order they were sent and answers in that order, so
each executor reads its own answer in turn (a ticket per request). The answer carries
the model's own compute time, which feeds the cost model: the time a batch waited
behind another is not the model's cost.

If the process dies (a crash in a native kernel, the OOM killer), the batches in flight
fail with ModelProcessError (the worker then retries their requests one by one, so a
request that kills the model goes to the DLQ alone) and the next call starts a new one.

With an address, the worker does not start a model process but connects to the shared
model host there (one per device, serving several worker processes and joining their
waiting batches into one call: model_host.py --listen, host_runner.py). The protocol is
the same plus an OPEN per model; its death is handled the same way, except that the
next call connects again instead of starting a process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipeline.errors import UserError
from pipeline.runtime import wire, wire_values
from pipeline.runtime.device import DeviceOptions
from pipeline.runtime.session import ProfiledSession, model_file

log = logging.getLogger(__name__)

_REPO_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT = 120.0  # s; loading a large model (or building TensorRT engines) is slow
_STOP_TIMEOUT = 10.0
_CONNECT_TIMEOUT = 30.0  # s; a shared host's supervisor restarts it within this
_CONNECT_RETRY = 0.1


def model_host_env() -> dict[str, str]:
    """The environment a model process (model_host.py) starts with: this one, with the
    repository first on PYTHONPATH so `-m pipeline.runtime.model_host` imports from
    where this worker does."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


class ModelProcessError(RuntimeError):
    """The model process died or its channel broke; the batch did not run."""


class ModelError(RuntimeError):
    """The model refused a batch (ONNX Runtime raised); the process is still serving."""


class _Channel:
    """One model process and its socket; replaced as a whole when the process dies.
    address: a connection to the shared model host there instead (no process of its own)."""

    def __init__(
        self, onnx_path: Path, providers: str, intra_op_threads: int, options: str | None = None, address: str | None = None
    ) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        if address:
            opening = {"model": str(onnx_path.resolve()), "providers": providers, "threads": intra_op_threads,
                       "options": options}
            self.sock = self._connect(address, opening)
        else:
            self.sock = self._spawn(onnx_path, providers, intra_op_threads, options)
        self.reader = wire.FrameReader(self.sock)
        self.slots: dict[int, wire.Slot] = {}
        self.sent = 0
        self._next_to_read = 0
        self._dead: str | None = None
        self._cond = threading.Condition()
        self._run: dict[str, object] = {}
        self.sock.settimeout(_START_TIMEOUT)
        try:
            kind, hello, _ = self.reader.read()
        except (OSError, EOFError) as exc:
            self.close()
            where = f"model host at {address}" if address else "model process"
            raise UserError(f"{where} for {onnx_path.name} did not start: {self._why(exc)}") from None
        self.sock.settimeout(None)
        if kind == wire.ERROR:
            self.close()
            raise UserError(hello["error"])
        self.hello = hello
        if address:
            self._run = {"handle": hello["handle"]}
        self.pid: int = self.proc.pid if self.proc is not None else int(hello["pid"])

    @staticmethod
    def _connect(address: str, opening: dict[str, object]) -> socket.socket:
        """Connected to the shared model host, the model's OPEN sent and its answer
        begun; retried while its supervisor (re)starts it: a host that is not there
        yet, or one that went away before answering (a connection made as it died)."""
        deadline = time.monotonic() + _CONNECT_TIMEOUT
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                sock.settimeout(_START_TIMEOUT)  # a large model loads for a while
                wire.send_frame(sock, wire.OPEN, opening)
                if sock.recv(1, socket.MSG_PEEK):  # HELLO or ERROR, read by the caller
                    return sock
                why = "it closed the connection"
            except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, BrokenPipeError) as exc:
                why = type(exc).__name__
            except TimeoutError:
                sock.close()
                raise UserError(f"model host at {address} did not answer within {_START_TIMEOUT:.0f} s") from None
            sock.close()
            if time.monotonic() >= deadline:
                raise UserError(f"model host at {address} does not answer: {why}")
            time.sleep(_CONNECT_RETRY)

    def _spawn(self, onnx_path: Path, providers: str, intra_op_threads: int, options: str | None) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = model_host_env()
        cmd = [
            sys.executable, "-m", "pipeline.runtime.model_host", "--fd", str(theirs.fileno()),
            "--model", str(onnx_path), "--providers", providers, "--intra-op-threads", str(intra_op_threads),
        ] + (["--session-options", options] if options else [])
        try:
            # own session: a terminal's Ctrl-C goes to the worker, which shuts down in order
            self.proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], env=env, start_new_session=True)
        finally:
            theirs.close()
        return ours

    def _why(self, exc: BaseException) -> str:
        code = self.proc.poll() if self.proc is not None else None
        if code is not None:
            return f"it exited with status {code}"
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    @property
    def dead(self) -> str | None:
        return self._dead

    def submit(self, feeds: Mapping[str, np.ndarray], slot: int) -> int:
        """Send one batch; the caller holds the session's send lock and owns the slot
        until this ticket's answer is read. Returns its ticket."""
        if self._dead:
            raise ModelProcessError(self._dead)
        ticket = self.sent
        arrays, packed = wire_values.pack(feeds)  # string inputs as bytes + lengths
        try:
            if wire.SHARED_MEMORY:
                place = self.slots.setdefault(slot, wire.Slot(slot))
                specs = place.place(self.sock, arrays)
                wire.send_frame(self.sock, wire.RUN, {**self._run, "slot": slot, "arrays": specs, "packed": packed})
            else:
                wire.send_frame(self.sock, wire.RUN, {**self._run, "slot": None, "packed": packed}, arrays)
        except OSError as exc:
            self._fail(f"model process channel broke: {self._why(exc)}")
            raise ModelProcessError(self._dead) from None
        self.sent += 1
        return ticket

    def receive(self, ticket: int) -> tuple[dict[str, np.ndarray], float]:
        """Wait for this ticket's turn, then read its answer from the socket."""
        with self._cond:
            while self._next_to_read != ticket and not self._dead:
                self._cond.wait()
            if self._dead:
                raise ModelProcessError(self._dead)
        try:
            kind, header, outputs = self.reader.read()
        except (OSError, EOFError, ValueError) as exc:
            self._fail(f"model process died: {self._why_after_eof(exc)}")
            raise ModelProcessError(self._dead) from None
        with self._cond:
            self._next_to_read += 1
            self._cond.notify_all()
        if kind == wire.ERROR:
            raise ModelError(header["error"])
        return wire_values.unpack(outputs, header.get("packed")), float(header["seconds"])

    def _why_after_eof(self, exc: BaseException) -> str:
        if self.proc is None:
            return f"the shared model host (pid {self.pid}) closed the connection"
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1.0)  # an EOF usually means it is exiting right now
        code = self.proc.poll()
        if code is not None and code < 0:
            return f"killed by signal {-code}"
        if code is not None:
            return f"exited with status {code}"
        return f"{type(exc).__name__}: {exc}"

    def _fail(self, why: str, quiet: bool = False) -> None:
        with self._cond:
            if self._dead is None:
                self._dead = why
                if not quiet:
                    log.error("%s", why)
            self._cond.notify_all()

    def close(self) -> None:
        self._fail("model process stopped", quiet=True)
        for slot in self.slots.values():
            slot.close()
        self.reader.close()
        self.sock.close()  # EOF: the process exits after the batch it is running
        if self.proc is None:
            return  # the shared host serves others; it releases this connection's model
        try:
            self.proc.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ProcessSession(ProfiledSession):
    """The InferenceSession interface, served by a model process (see module doc), or
    with `address` by the shared model host listening there (model_host.py --listen):
    connected to instead of started, and connected to again (for up to 30 s, while its
    supervisor starts it again) after it died."""

    def __init__(
        self,
        onnx_path: str | Path,
        providers: str | Sequence[str] = "auto",
        intra_op_threads: int = 1,
        on_restart: Callable[[], None] | None = None,
        device: DeviceOptions | None = None,
        address: str | None = None,
    ) -> None:
        self.path = path = model_file(onnx_path)
        # the model process's one thread captures and replays graphs (device.py)
        self._options = None if device is None else replace(device, graphs_on_caller_thread=True).to_json()
        self._providers = providers if isinstance(providers, str) else ",".join(providers)
        self._threads = intra_op_threads
        self.address = address
        self._send_lock = threading.Lock()
        self._closed = False
        self._cores: set[int] | None = None
        self._free_slots: list[int] = []
        self._slots_made = 0
        self._channel = self._start()
        hello = self._channel.hello
        self.provider: str = hello["provider"]
        self.input_names: list[str] = hello["input_names"]
        self.output_names: list[str] = hello["output_names"]
        self.restarts = 0
        self._on_restart = on_restart
        where = f"the shared model host at {address}, pid" if address else "process"
        log.info(
            "model %s runs in %s %d on provider %s (intra-op threads %d)",
            path.name, where, self.pid, self.provider, intra_op_threads,
        )

    @property
    def pid(self) -> int:
        channel = self._channel
        return channel.proc.pid if channel.proc is not None else channel.pid

    def _start(self) -> _Channel:
        if self.address is not None:
            return _Channel(self.path, self._providers, self._threads, self._options, self.address)
        extra = (self._options,) if self._options else ()  # the device keys, when given
        channel = _Channel(self.path, self._providers, self._threads, *extra)
        if self._cores is not None:
            os.sched_setaffinity(channel.proc.pid, self._cores)
        return channel

    def pin(self, cores: set[int]) -> None:
        """Run the model process on these cores only (runtime.pin_executors), also
        after a restart. Not a shared host: it serves other workers too, and where it
        runs is its supervisor's choice."""
        if self.address is not None:
            log.info("runtime.pin_executors: the shared model host is not pinned by a worker")
            return
        with self._send_lock:
            self._cores = set(cores)
            os.sched_setaffinity(self._channel.proc.pid, self._cores)

    def run_timed(self, feeds: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """(outputs, the model process's own seconds for this batch)."""
        with self._send_lock:
            if self._closed:
                raise ModelProcessError("model process stopped")
            channel = self._channel
            if channel.dead:
                channel.close()
                self.restarts += 1
                log.warning("starting model process again (restart %d)", self.restarts)
                # Counted before the attempt: a model that no longer loads fails every
                # batch here, and each try must show (tidebatch_model_process_restarts_total
                # drives the TidebatchModelProcessRestarting alert).
                if self._on_restart is not None:
                    self._on_restart()
                channel = self._channel = self._start()
            # A slot per batch in flight: one is written again only after its answer.
            if self._free_slots:
                slot = self._free_slots.pop()
            else:
                slot, self._slots_made = self._slots_made, self._slots_made + 1
            try:
                ticket = channel.submit(feeds, slot)
            except BaseException:
                self._free_slots.append(slot)
                raise
        try:
            return channel.receive(ticket)
        finally:
            with self._send_lock:
                self._free_slots.append(slot)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.run_timed(feeds)[0]

    def close(self) -> None:
        with self._send_lock:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> ProcessSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

