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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 1024 * 1024


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve allocations over `threshold` bytes with mmap, always. False where the C
    library has no mallopt (not glibc)."""
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
    return ok
