"""The worker's process-wide GIL and GC settings go back to what they were."""

from __future__ import annotations

import gc
import sys

from pipeline.runtime import interpreter


def test_apply_sets_and_restore_puts_back_switch_interval_and_gc() -> None:
    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    frozen = gc.get_freeze_count()
    restore = interpreter.apply(0.0042, 12_345)
    try:
        assert sys.getswitchinterval() == 0.0042
        assert gc.get_threshold() == (12_345, threshold[1], threshold[2])
        assert gc.get_freeze_count() > frozen  # start-up objects leave the scans
    finally:
        restore()
    assert sys.getswitchinterval() == interval
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == 0


def test_no_threshold_leaves_the_collector_alone() -> None:
    threshold = gc.get_threshold()
    restore = interpreter.apply(sys.getswitchinterval(), None)
    assert gc.get_threshold() == threshold and gc.get_freeze_count() == 0
    restore()
    assert gc.get_threshold() == threshold
