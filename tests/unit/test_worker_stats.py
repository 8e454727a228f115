"""WorkerStats is a dataclass: each worker gets its own counters and `extra` dict.
(Inserting _Finished above it once took its @dataclass away: `extra` became a shared
dataclasses.Field and the repr in test failures lost its fields.)"""

from __future__ import annotations

import dataclasses

from pipeline.delivery.stats import WorkerStats


def test_worker_stats_is_a_dataclass_with_its_own_extra_dict():
    a, b = WorkerStats(), WorkerStats()
    assert dataclasses.is_dataclass(a)
    assert a.extra == {} and a.extra is not b.extra
    assert "consumed=0" in repr(a)


def test_worker_stats_count_from_threads_and_asdict_has_only_counts():
    import threading

    s = WorkerStats()
    threads = [threading.Thread(target=lambda: [s.count("scored") for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.count_many(batches=2, batch_rows=10)
    assert s.scored == 4000 and s.batches == 2
    assert "_lock" not in dataclasses.asdict(s)
    assert "mean_batch_rows=5.0" in s.line()
