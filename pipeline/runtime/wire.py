"""Frames between the worker and its model process (model_process.py, model_host.py),
or the shared model host that several workers connect to (host_server.py).

A frame is a 5-byte prefix (kind, header length), a small JSON header, then the bytes
of any inline arrays in header order. Batches go the other way through shared memory:
the worker copies each batch into a slot (a memfd, one per batch in flight, handed to
the model process once with SCM_RIGHTS) and sends only the arrays' places in it.

Why not the socket for batches too: a 495-row CTR batch is 129 KB, more than a Unix
socket buffers (208 KB default, shared by the batches in flight), so the worker's
sending thread had to be on a core for the model process to receive its batch. On two
busy cores that wait left the model idle a fifth of the time. A memfd also needs no
name and no clean-up: it is freed when both processes have closed it, even after a
SIGKILL. Where memfd_create is missing (not Linux), batches go inline instead.

Results come back inline: a score per row is a few KB, well inside the buffer, so the
model process never waits for the worker to read them.

Frames carry numeric arrays only; string tensors and sequences of maps (a ZipMap's
class probabilities) travel packed into numeric arrays by wire_values.py, both ways.
"""

from __future__ import annotations

import array
import mmap
import os
import socket
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson

HELLO = 1  # model process -> worker, once: {"provider", "input_names", "output_names"}
SLOT = 2  # worker -> model process: {"slot", "size"} + the memfd as SCM_RIGHTS
RUN = 3  # worker -> model process: {"slot": int | None, "arrays": [...]}
RESULT = 4  # model process -> worker: {"seconds"} + inline arrays
ERROR = 5  # model process -> worker: {"error": one line}
# The shared model host only: RUN frames then also name their model ("handle"), and a
# RESULT says how many requests and rows its call held ("requests", "rows").
OPEN = 6  # worker -> host: {"model", "providers", "threads"}; answered HELLO (+ "handle", "pid") or ERROR
STATS = 7  # either way: {} asks, the host answers its counters (host_server.py)

_PREFIX = struct.Struct("<BI")
_MAX_HEADER = 1 << 20
_ALIGN = 64
SHARED_MEMORY = hasattr(os, "memfd_create")


class ChannelClosed(EOFError):
    """The other end closed the socket (or died) mid-frame or between frames."""


def _spec(name: str, arr: np.ndarray) -> list[Any]:
    if arr.dtype.hasobject:
        raise TypeError(f"array {name!r} has dtype {arr.dtype}; only numeric arrays cross to the model process")
    return [name, arr.dtype.str, list(arr.shape)]


def _encode(kind: int, header: dict[str, Any]) -> bytes:
    head = orjson.dumps(header)
    return _PREFIX.pack(kind, len(head)) + head


def send_frame(
    sock: socket.socket, kind: int, header: dict[str, Any], arrays: Mapping[str, np.ndarray] | None = None
) -> None:
    """Header plus inline arrays, in one scatter/gather send from the arrays' memory."""
    parts: list[memoryview] = []
    if arrays:
        specs = []
        for name, arr in arrays.items():
            a = np.asarray(arr, order="C")
            specs.append(_spec(name, a))
            if a.nbytes:
                parts.append(memoryview(a).cast("B"))
        header = {**header, "arrays": specs}
    _send_all(sock, [memoryview(_encode(kind, header)), *parts])


class Slot:
    """Worker side of one shared-memory slot: a memfd, grown as batches need."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.size = 0
        self._map: mmap.mmap | None = None

    def place(self, sock: socket.socket, arrays: Mapping[str, np.ndarray]) -> list[list[Any]]:
        """Copy the arrays into the slot (a bigger one first if needed, sent to the
        model process) and return their specs with offsets for the RUN header."""
        contiguous = {name: np.asarray(a, order="C") for name, a in arrays.items()}
        specs, offset = [], 0
        for name, a in contiguous.items():
            specs.append([*_spec(name, a), offset])
            offset += -(-a.nbytes // _ALIGN) * _ALIGN
        if offset > self.size:
            self._grow(sock, offset)
        assert self._map is not None
        for (_, _, _, start), a in zip(specs, contiguous.values(), strict=True):
            if a.nbytes:  # a memcpy that keeps the GIL: no hand-over on the hot path
                self._map[start : start + a.nbytes] = memoryview(a).cast("B")
        return specs

    def _grow(self, sock: socket.socket, need: int) -> None:
        size = max(1 << 16, 1 << (need - 1).bit_length())
        fd = os.memfd_create(f"tidebatch-slot-{self.index}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            new_map = mmap.mmap(fd, size)
            socket.send_fds(sock, [_encode(SLOT, {"slot": self.index, "size": size})], [fd])
        finally:
            os.close(fd)  # the mapping and the model process keep the memory alive
        self.close()
        self._map, self.size = new_map, size

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


def slot_arrays(memory: mmap.mmap, specs: list[list[Any]]) -> dict[str, np.ndarray]:
    """Model side: views of a RUN frame's arrays in its slot, no copy."""
    return {
        name: np.frombuffer(memory, dtype=np.dtype(dtype), count=int(np.prod(shape)), offset=offset).reshape(shape)
        for name, dtype, shape, offset in specs
    }


class FrameReader:
    """Worker side: frames from the model process, read through a buffer so that an
    answer usually costs one recv, i.e. one wait to take the GIL back."""

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb", buffering=1 << 18)

    def read(self) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
        return _read_body(self._exact(_PREFIX.size), self._exact, self._into)

    def _exact(self, n: int) -> bytes:
        data = self._file.read(n)
        if len(data) != n:
            raise ChannelClosed("the model process channel closed")
        return data

    def _into(self, view: memoryview) -> None:
        if self._file.readinto(view) != len(view):
            raise ChannelClosed("the model process channel closed")

    def close(self) -> None:
        self._file.close()


def recv_frame(sock: socket.socket) -> tuple[int, dict[str, Any], dict[str, np.ndarray], list[int]]:
    """Model side: one frame, plus any descriptors sent with it (SLOT frames)."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(_PREFIX.size, socket.CMSG_SPACE(fds.itemsize))
    if not data:
        raise ChannelClosed("the worker closed the channel")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    prefix = data + _recv_exact(sock, _PREFIX.size - len(data))
    kind, header, arrays = _read_body(prefix, lambda n: _recv_exact(sock, n), lambda v: _recv_into(sock, v))
    return kind, header, arrays, list(fds)


def _read_body(
    prefix: bytes, exact: Callable[[int], bytes], into: Callable[[memoryview], None]
) -> tuple[int, dict[str, Any], dict[str, np.ndarray]]:
    """The rest of a frame after its prefix, read with either side's primitives. Inline
    arrays are read and their specs taken out of the header; a RUN frame's arrays
    are in its slot, so their specs (with offsets) stay in the header."""
    kind, size = _PREFIX.unpack(prefix)
    if size > _MAX_HEADER:
        raise ValueError(f"frame header of {size} bytes: the stream is out of step")
    header = orjson.loads(exact(size))
    arrays: dict[str, np.ndarray] = {}
    if header.get("slot") is None:
        for name, dtype, shape in header.pop("arrays", []):
            arr = np.empty(shape, dtype=np.dtype(dtype))
            if arr.nbytes:
                into(memoryview(arr).cast("B"))
            arrays[name] = arr
    return kind, header, arrays


def _send_all(sock: socket.socket, parts: list[memoryview]) -> None:
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts.pop(0)
        if sent:
            parts[0] = parts[0][sent:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        got = sock.recv_into(view)
        if got == 0:
            raise ChannelClosed("the model process channel closed")
        view = view[got:]
