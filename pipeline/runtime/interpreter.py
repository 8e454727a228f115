"""Process-wide interpreter settings for a worker, applied at start and undone at
shutdown (a worker run inside another program, such as the tests or the demo, must
leave that program as it found it).

Both settings decide how promptly the worker's threads get the GIL, which is what
limits one worker on a small machine (docs/OPERATIONS.md, "Capacity of one worker").

- The GIL switch interval: how long a thread may hold the GIL while another waits.
  With the model in the worker's process, the executor must get the GIL back at once
  after each ONNX Runtime call: 0.1 ms (Python's 5 ms made it wait; 0.5 -> 0.1 ms made
  binary-request drains 5-11 % faster). With a model process and a backlog
  (batching/depth.py: several batches in flight), nothing waits on the model's side,
  and Python's 5 ms keeps the source, publisher and executor threads from handing the
  GIL to and fro: drains ran at 291-305k rows/s with 0.1-1 ms against 319-335k with
  5 ms. Without a backlog the worker keeps 0.1 ms, for latency: each request crosses
  three threads, and each crossing can wait a whole interval.
- The garbage collector: at ~15k requests/s the worker allocates ~150k objects a
  second, so the default gen-0 threshold of 700 ran ~150 collections a second, and
  the queued requests (thousands of live objects) were rescanned by every gen-1
  collection (1.4-1.8 ms each) and gen-2 collection (10-22 ms each), all with the
  GIL held. ``gc.freeze()`` after start-up takes the modules, the model's metadata
  and the warm-up's objects out of every later scan, and a gen-0 threshold of 20,000
  makes collections ~45x rarer: 322-324k against 290-302k rows/s in the same drains.
  Reference counting frees almost everything the worker allocates; the collector only
  finds cycles, and they wait a little longer.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

CALM_SWITCH_INTERVAL_S = 0.0001
BACKLOG_SWITCH_INTERVAL_S = 0.005


def set_switch_interval(backlogged: bool) -> None:
    """The interval for the queue's mode (batching/depth.py)."""
    sys.setswitchinterval(BACKLOG_SWITCH_INTERVAL_S if backlogged else CALM_SWITCH_INTERVAL_S)


def apply(switch_interval_s: float, gc_gen0_threshold: int | None) -> Callable[[], None]:
    """Set the switch interval and, if given, freeze the current heap and raise the
    gen-0 threshold. Returns the function that puts everything back."""
    old_interval = sys.getswitchinterval()
    old_threshold = gc.get_threshold()
    sys.setswitchinterval(switch_interval_s)
    if gc_gen0_threshold is not None:
        gc.collect()
        gc.freeze()
        gc.set_threshold(gc_gen0_threshold, old_threshold[1], old_threshold[2])

    def restore() -> None:
        sys.setswitchinterval(old_interval)
        if gc_gen0_threshold is not None:
            gc.set_threshold(*old_threshold)
            gc.unfreeze()

    return restore
