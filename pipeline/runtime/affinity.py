"""Give each executor thread, or the model process, a core of its own (Linux only).

Why: inside the worker a CTR batch took 1.75-2.0 ms against 1.36 ms for the same
model alone (bench/pipeline_capacity.py, tidebatch_inference_seconds): the decoding,
publishing, librdkafka and broker threads kept preempting the model's thread and
evicting its caches. With `runtime.pin_executors`, executor i runs only on the i-th
allowed core, and every other thread of the process (librdkafka's included, and the
threads it starts later, which inherit the mask) on the remaining cores. With a
model process (runtime/model_process.py) the model process gets the first core and
every thread of the worker the others.

Off by default, because it only pays when the worker has its cores to itself. On
this 2-core machine, with the embedded broker and the load generator sharing the
cores:
- in-process, pinning raised a binary-request backlog drain from 236-268k to
  283-288k rows/s, but at 3980 req/s open-loop (half the JSON static saturation,
  adaptive policy) p99 went from 54-62 ms unpinned to 679-1488 ms pinned: the
  executor could no longer move off a core the broker or the load generator was
  using, and requests queued behind it;
- with a model process, pinning raised the same drain from 250-277k to 284-338k rows/s
  (the model process busy 94 % of its core against 82 % unpinned), the most of any
  configuration; at half load (adaptive, JSON, 3400-3700 req/s, six runs each) p50 /
  p99 were 17-52 / 44-669 ms pinned against 31-93 / 56-1115 ms unpinned (in-process
  unpinned: 17-39 / 65-270 ms). Pinning only the model process and leaving the
  worker's threads free did neither (250k rows/s, 36-46 / 478-642 ms): what the
  model needs is a core the worker's threads stay off.
Turn it on where the worker owns its cores (a Kubernetes pod with the static CPU
manager, a dedicated VM).
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def plan(executors: int) -> tuple[list[set[int]], set[int]] | None:
    """(one core per executor, the cores for everything else), or None when there are
    not more allowed cores than executors (pinning would starve the other threads)."""
    if not supported():
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= executors:
        return None
    return [{c} for c in cores[:executors]], set(cores[executors:])


def pin_current_thread(cores: set[int]) -> None:
    os.sched_setaffinity(0, cores)  # 0: the calling thread on Linux


def pin_other_threads(keep: Iterable[int], cores: set[int]) -> int:
    """Move every thread of this process except `keep` (native ids) onto `cores`;
    returns how many were moved. Threads that exit meanwhile are skipped."""
    skip = set(keep)
    moved = 0
    for name in os.listdir("/proc/self/task"):
        tid = int(name)
        if tid in skip:
            continue
        try:
            os.sched_setaffinity(tid, cores)
            moved += 1
        except OSError:  # exited meanwhile
            pass
    return moved
