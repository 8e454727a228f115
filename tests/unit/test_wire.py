"""Frames between the worker and its model process (pipeline/runtime/wire.py), over a
real socket pair in one process: the model side is called directly."""

from __future__ import annotations

import mmap
import os
import socket
import struct

import numpy as np
import pytest

from pipeline.runtime import wire


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield ours, theirs
    ours.close()
    theirs.close()


def arrays_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k], equal_nan=True)
        for k in a
    )


def test_inline_arrays_cross_unchanged_both_ways(pair) -> None:
    ours, theirs = pair
    rng = np.random.default_rng(1)
    sent = {
        "dense": rng.random((7, 13), dtype=np.float32),
        "cat": rng.integers(0, 2**40, (7, 26), dtype=np.int64),
        "image": rng.random((2, 3, 4, 5)).astype(np.float16),
        "empty": np.zeros((0, 26), dtype=np.int64),
        "scalar": np.array(3.5),
        "strided": np.arange(20, dtype=np.int32)[::2],  # not contiguous: sent as a copy
    }
    wire.send_frame(ours, wire.RUN, {"slot": None}, sent)
    kind, header, got, fds = wire.recv_frame(theirs)
    assert (kind, header["slot"], fds) == (wire.RUN, None, [])
    assert arrays_equal(got, sent)
    # and back, through the worker's buffered reader
    wire.send_frame(theirs, wire.RESULT, {"seconds": 0.25}, got)
    kind, header, back = wire.FrameReader(ours).read()
    assert (kind, header) == (wire.RESULT, {"seconds": 0.25})
    assert arrays_equal(back, sent)


def test_buffered_reader_keeps_the_next_frame_for_the_next_read(pair) -> None:
    ours, theirs = pair
    for i in range(3):  # three answers in the socket before the first read
        wire.send_frame(theirs, wire.RESULT, {"seconds": i}, {"prob": np.full(5, i, np.float32)})
    reader = wire.FrameReader(ours)
    for i in range(3):
        _, header, out = reader.read()
        assert header["seconds"] == i and (out["prob"] == i).all()


@pytest.mark.skipif(not wire.SHARED_MEMORY, reason="memfd_create is Linux-only")
def test_slot_carries_batches_through_shared_memory_and_grows(pair) -> None:
    ours, theirs = pair
    slot = wire.Slot(0)
    memory = {}

    def model_side_receives() -> dict[str, np.ndarray]:
        while True:
            kind, header, inline, fds = wire.recv_frame(theirs)
            if kind == wire.SLOT:
                assert len(fds) == 1
                memory[header["slot"]] = mmap.mmap(fds[0], header["size"])
                os.close(fds[0])
                continue
            assert kind == wire.RUN and inline == {}
            return {k: v.copy() for k, v in wire.slot_arrays(memory[header["slot"]], header["arrays"]).items()}

    small = {"dense": np.ones((3, 13), np.float32), "cat": np.arange(78, dtype=np.int64).reshape(3, 26)}
    wire.send_frame(ours, wire.RUN, {"slot": 0, "arrays": slot.place(ours, small)})
    assert arrays_equal(model_side_receives(), small)
    first_size = slot.size
    big = {"dense": np.full((4000, 13), 2.0, np.float32), "cat": np.ones((4000, 26), np.int64)}
    wire.send_frame(ours, wire.RUN, {"slot": 0, "arrays": slot.place(ours, big)})
    assert slot.size > first_size  # a new, bigger memfd was handed over
    assert arrays_equal(model_side_receives(), big)
    slot.close()


def test_object_arrays_are_refused_before_anything_is_sent(pair) -> None:
    ours, theirs = pair
    with pytest.raises(TypeError, match="only numeric arrays"):
        wire.send_frame(ours, wire.RUN, {"slot": None}, {"names": np.array(["a", None], dtype=object)})
    theirs.setblocking(False)
    with pytest.raises(BlockingIOError):
        theirs.recv(1)  # nothing half-written on the stream


def test_a_closed_channel_and_a_garbled_stream_are_errors(pair) -> None:
    ours, theirs = pair
    theirs.sendall(struct.pack("<BI", wire.RESULT, 1 << 30))
    with pytest.raises(ValueError, match="out of step"):
        wire.FrameReader(ours).read()
    theirs.close()
    with pytest.raises(wire.ChannelClosed):
        wire.recv_frame(ours)
