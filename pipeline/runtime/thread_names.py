"""The worker's threads under their own names in the operating system (Linux), so that
per-thread CPU says which thread spent it: `top -H -p PID`, `ps -L`, py-spy's native
view and /proc/PID/task/*/stat all read the kernel's name, and Python's
threading names never reach it (every thread of a worker was "python", the source
thread, the executors and the publisher alike). Profiling the CTR backlog drain of
issue 23 needed this split (docs/OPERATIONS.md, "Drain throughput").

The main thread is left alone: its name is the process's name in `ps` and `top`."""

from __future__ import annotations

import threading
from pathlib import Path

# The kernel keeps 15 bytes of a thread's name (TASK_COMM_LEN 16, with the NUL).
MAX_NAME_BYTES = 15


def os_name(name: str) -> str:
    """`name` as the kernel will keep it: ASCII, at most 15 bytes."""
    return name.encode("ascii", "replace").decode("ascii")[:MAX_NAME_BYTES]


def name_current_thread(name: str) -> bool:
    """Give the calling thread `name` in the kernel (truncated to 15 bytes). False,
    doing nothing, on the main thread and where there is no /proc (not Linux)."""
    if threading.current_thread() is threading.main_thread():
        return False
    try:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(os_name(name))
    except OSError:
        return False
    return True


def cpu_seconds_by_thread(pid: int | str = "self") -> dict[str, float]:
    """User + system CPU seconds so far of each thread of a process, by kernel name
    (threads of one name summed: librdkafka starts one per broker). {} without /proc."""
    import os

    hz = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        name = raw.split("(", 1)[1].rsplit(")", 1)[0]
        fields = raw.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / hz  # utime, stime
    return out
