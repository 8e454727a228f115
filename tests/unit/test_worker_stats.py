"""WorkerStats is a dataclass: each worker gets its own counters and `extra` dict.
(Inserting _Finished above it once took its @dataclass away: `extra` became a shared
dataclasses.Field and the repr in test failures lost its fields.)"""

from __future__ import annotations

import dataclasses

from pipeline.worker import WorkerStats


def test_worker_stats_is_a_dataclass_with_its_own_extra_dict():
    a, b = WorkerStats(), WorkerStats()
    assert dataclasses.is_dataclass(a)
    assert a.extra == {} and a.extra is not b.extra
    assert "consumed=0" in repr(a)
