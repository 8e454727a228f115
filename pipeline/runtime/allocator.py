"""The C allocator's settings for a worker (glibc only; elsewhere nothing is done).

glibc serves a large allocation (a Kafka record's value, librdkafka's copy of a
produced record, a decoded image) with its own mmap and returns it to the system when
freed, but each such free raises the threshold for the next ones, up to 32 MiB: from
then on, values of a few MB come from the heap, and the holes they leave between
smaller live blocks are not given back. Measured with refused 10 MB camera frames
(tests/integration/test_hostile_input.py): the worker's RSS grew by 840 MB over 120
frames, without bound, although nothing kept a reference to them; with the threshold
fixed at 1 MiB, by 112 MB, from the Kafka clients' buffers. Fixing the threshold stops
the adjustment for the whole process, for good (glibc has no way back to it), which is
harmless in the programs that run a worker (the worker, the tests, the demo): blocks
of over 1 MiB are then always mapped and unmapped, a few page faults per megabyte,
next to the cost of decoding or scoring that megabyte.

Fixing that threshold also fixes glibc's trim threshold at its default, 128 KiB: each
time the free space at the top of the heap exceeds it, the heap is shrunk, and the next
block there is faulted in again, page by page. The CTR JSON fast path
(pipeline/codecs/ctr_fast.py) makes a few dozen arrays of 128 KiB..1 MiB per poll: with
the default, each of them cost its page faults again (~5 a request, ~40 us of the ~120
in bench/ctr_codec.py). So the trim threshold is set too, to TRIM_THRESHOLD_BYTES:
at most that much free heap stays mapped, and those blocks are reused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1024 * 1024
TRIM_THRESHOLD_BYTES = 32 * 1024 * 1024


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve allocations over `threshold` bytes with mmap, always, and keep up to
    TRIM_THRESHOLD_BYTES of free heap mapped. False where the C library has no mallopt
    (not glibc)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD, %d) refused", threshold)
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) != 1:
        log.debug("mallopt(M_TRIM_THRESHOLD, %d) refused", TRIM_THRESHOLD_BYTES)
    return ok
