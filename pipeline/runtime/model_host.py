"""The model process: loads one ONNX model and runs the batches the worker sends, one
at a time, in order (model_process.py is the worker's side; wire.py the frames).

    python -m pipeline.runtime.model_host --fd N --model PATH [--providers auto] [--intra-op-threads 1]
        [--session-options JSON]  (device.py DeviceOptions: the runtime section's GPU keys)

Or the shared model host, one per device, serving every worker process that connects
to its Unix socket and joining their waiting batches into one call (host_server.py,
host_runner.py, coalesce.py; shared_host.py starts it):

    python -m pipeline.runtime.model_host --listen PATH [--providers P] [--intra-op-threads T] [--max-rows R]

It has no Python work besides ONNX Runtime, so nothing competes with the model for
the GIL. It ignores SIGINT and SIGTERM (a Ctrl-C or a signal to the worker's process
group must not kill batches the worker is still finishing on shutdown) and exits when
the worker closes the socket or dies. The shared host exits on SIGTERM (its supervisor
stops it after its workers), and with --parent PID when that process dies.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import signal
import socket
import sys
import threading
import time

from pipeline.runtime import wire, wire_values

_PARENT_POLL_S = 0.5


def serve(sock: socket.socket, model: str, providers: str, intra_op_threads: int, options: str | None = None) -> int:
    from pipeline.errors import UserError
    from pipeline.runtime.device import DeviceOptions
    from pipeline.runtime.session import InferenceSession

    try:
        device = DeviceOptions.from_json(options) if options else None
        session = InferenceSession(model, providers, intra_op_threads, device=device)
    except UserError as exc:
        wire.send_frame(sock, wire.ERROR, {"error": str(exc)})
        return 2
    wire.send_frame(
        sock,
        wire.HELLO,
        {"provider": session.provider, "input_names": session.input_names, "output_names": session.output_names},
    )
    slots: dict[int, mmap.mmap] = {}
    while True:
        try:
            kind, header, feeds, fds = wire.recv_frame(sock)
        except (wire.ChannelClosed, ConnectionError):
            return 0  # the worker is gone or done
        if kind == wire.SLOT:
            if fds:
                _replace_slot(slots, header["slot"], fds[0], header["size"])
            continue
        if kind != wire.RUN:
            wire.send_frame(sock, wire.ERROR, {"error": f"unexpected frame kind {kind}"})
            continue
        t0 = time.perf_counter()
        try:
            if header.get("slot") is not None:
                feeds = wire.slot_arrays(slots[header["slot"]], header["arrays"])
            outputs = session.run(wire_values.unpack(feeds, header.get("packed")))
            # string tensors and sequences of maps (a ZipMap) as numeric arrays
            arrays, packed = wire_values.pack(outputs)
        except Exception as exc:  # ORT's own types: shape, dtype, kernel failures
            first = f"{type(exc).__name__}: {exc}".splitlines()[0]
            wire.send_frame(sock, wire.ERROR, {"error": first})
            continue
        seconds = time.perf_counter() - t0
        try:
            wire.send_frame(sock, wire.RESULT, {"seconds": seconds, "packed": packed}, arrays)
        except (ConnectionError, OSError):
            return 0


def _replace_slot(slots: dict[int, mmap.mmap], index: int, fd: int, size: int) -> None:
    try:
        old = slots.pop(index, None)
        if old is not None:
            old.close()
        slots[index] = mmap.mmap(fd, size)
    finally:
        os.close(fd)


def listen(address: str, providers: str, intra_op_threads: int, max_rows: int) -> int:
    from pipeline.runtime.device import DeviceOptions
    from pipeline.runtime.host_models import Models
    from pipeline.runtime.host_runner import Runner
    from pipeline.runtime.host_server import Host
    from pipeline.runtime.session import InferenceSession

    def open_model(path: str, providers: str, threads: int, options: str | None) -> InferenceSession:
        # the worker's device keys (its OPEN's "options"), as its own model process gets them
        return InferenceSession(path, providers, threads, device=DeviceOptions.from_json(options) if options else None)

    host = Host(Models(open_model), Runner(max_rows), providers, intra_op_threads)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(address)  # a host that was killed leaves its socket file behind
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(256)
    try:
        host.serve_forever(listener)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
    return 0


def die_with(parent: int, deathsig: bool) -> None:
    """End this process when its parent dies, so that a supervisor killed with SIGKILL
    leaves no host behind; exits now if the parent is already gone. deathsig: also ask
    the kernel for SIGKILL at once (prctl PR_SET_PDEATHSIG, Linux) - only for a parent
    that started us from its main thread: the signal comes when the *thread* that
    started the child ends, and a supervisor restarting its host from a watch thread
    would see it killed when that thread ended. The watch thread here covers the rest."""
    if deathsig:
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        sys.exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tidebatch-model-host")
    ap.add_argument("--fd", type=int)
    ap.add_argument("--model")
    ap.add_argument("--listen", metavar="ADDRESS", help="serve every worker that connects to this Unix socket")
    ap.add_argument("--providers", default="auto")
    ap.add_argument("--intra-op-threads", type=int, default=1)
    ap.add_argument("--session-options", default=None)
    ap.add_argument("--max-rows", type=int, default=4096, help="rows in one joined call at most (--listen)")
    ap.add_argument("--parent", type=int, help="exit when this process (the supervisor) dies")
    ap.add_argument("--deathsig", action="store_true", help="with --parent: SIGKILL by the kernel when it dies")
    args = ap.parse_args(argv)
    if args.parent is not None:
        die_with(args.parent, args.deathsig)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.listen:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        return listen(args.listen, args.providers, args.intra_op_threads, max(1, args.max_rows))
    if args.fd is None or args.model is None:
        ap.error("--fd and --model, or --listen")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock, args.model, args.providers, args.intra_op_threads, args.session_options)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
