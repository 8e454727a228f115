"""Scale-out: three `tidebatch run` processes in one consumer group share a 6-partition
topic; one is SIGKILLed mid-stream, the other two take its partitions over, and every
request still gets a result (at-least-once: replays may add duplicates, never gaps).

On the embedded broker members are stopped one at a time: a group can get stuck for
good when two leave together and one joins (docs/BROKERS.md)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TypeVar

from tests.integration.opsutil import (
    ResultCollector,
    WorkerProcess,
    make_topics,
    produce_ctr,
    start_worker_process,
    wait_for,
)
from tests.integration.pipeline_helpers import QUICK_EVICTION_ENV

T = TypeVar("T")
PARTITIONS = 6


def _sharing(workers: list[WorkerProcess]) -> list[list[tuple[str, int]]] | None:
    """Each worker's partitions, once together they own all of them exactly once and
    evenly (a rebalance in progress shows gaps or a lopsided split); else None."""
    parts = [w.assigned() for w in workers]
    if any(not p for p in parts):
        return None
    sizes = [len(p) for p in parts]  # type: ignore[arg-type]
    flat = {tp for p in parts for tp in p}  # type: ignore[union-attr]
    even = max(sizes) - min(sizes) <= 1
    return parts if sum(sizes) == PARTITIONS == len(flat) and even else None  # type: ignore[return-value]


def _wait(workers: list[WorkerProcess], check: Callable[[], T], timeout: float, what: str) -> T:
    """wait_for, with the workers' log tails in the failure message."""
    try:
        return wait_for(check, timeout, what, interval=0.25)
    except AssertionError as exc:
        logs = "\n".join(f"--- {w.name} (exit {w.proc.poll()}):\n{w.log_tail()}" for w in workers)
        raise AssertionError(f"{exc}\n{logs}") from None


def test_workers_share_partitions_and_survive_a_sigkill(broker, topic_factory, unique_group_id, tmp_path):
    topics = make_topics(topic_factory, PARTITIONS)
    workers = [
        start_worker_process(broker, topics, unique_group_id, tmp_path, f"worker-{i}", **QUICK_EVICTION_ENV)
        for i in range(3)
    ]
    collector = ResultCollector(broker.bootstrap_servers, topics.output)
    try:
        shares = _wait(workers, lambda: _sharing(workers), 120, "three workers to share six partitions")
        assert sorted(len(s) for s in shares) == [2, 2, 2], shares

        ids = produce_ctr(broker.bootstrap_servers, topics.input, 600, seed=31)
        _wait(workers, lambda: len(ids) - len(collector.missing(ids)) >= 100, 60, "the first results")

        victim, survivors = workers[0], workers[1:]
        victim_parts = set(victim.assigned() or [])
        victim.kill(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        ids += produce_ctr(broker.bootstrap_servers, topics.input, 600, seed=31, start=600)

        # The victim's session times out (6 s: QUICK_EVICTION_ENV), then a rebalance.
        shares = _wait(survivors, lambda: _sharing(survivors), 90, "the survivors to take all six partitions")
        assert victim_parts <= {tp for s in shares for tp in s}
        _wait(survivors, lambda: not collector.missing(ids), 120, f"a result for each of {len(ids)} requests")
        assert not collector.missing(ids)
    finally:
        collector.close()
        # One member at a time, each gone before the next leaves.
        codes = [w.stop() if w.proc.poll() is None else None for w in workers[1:]]
        for w in workers:
            w.kill(signal.SIGKILL)
            w.proc.wait(timeout=10)
    assert codes == [0, 0], [w.log_tail() for w in workers[1:]]
