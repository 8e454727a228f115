"""The model process: loads one ONNX model and runs the batches the worker sends, one
at a time, in order (model_process.py is the worker's side; wire.py the frames).

    python -m pipeline.runtime.model_host --fd N --model PATH [--providers auto] [--intra-op-threads 1]
        [--session-options JSON]  (device.py DeviceOptions: the runtime section's GPU keys)

It has no Python work besides ONNX Runtime, so nothing competes with the model for
the GIL. It ignores SIGINT and SIGTERM (a Ctrl-C or a signal to the worker's process
group must not kill batches the worker is still finishing on shutdown) and exits when
the worker closes the socket or dies.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import socket
import sys
import time

from pipeline.runtime import wire, wire_values


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tidebatch-model-host")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--providers", default="auto")
    ap.add_argument("--intra-op-threads", type=int, default=1)
    ap.add_argument("--session-options", default=None)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    try:
        return serve(sock, args.model, args.providers, args.intra_op_threads, args.session_options)
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
