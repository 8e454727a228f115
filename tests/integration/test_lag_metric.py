"""Consumer lag in the metrics is the fetch high watermark minus the position, right on
the embedded broker (whose ListOffsets "latest" is wrong, docs/BROKERS.md): N requests wait
in the topic, the worker holds them back, the lag gauge shows what is left, then
falls to 0 once the worker catches up."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from consumers.records import SourceRecord
from pipeline.batching.backpressure import Intake
from pipeline.codecs.base import Decoded
from pipeline.ops import stats as S
from tests.integration.opsutil import (
    http_get,
    live_worker,
    make_topics,
    produce_ctr,
    wait_for,
    worker_config,
)

N = 4000  # the worker takes at most one poll (1000 records) before it holds


class Gate:
    """A WorkerHook that holds every batch until opened: the executor blocks, the
    queue fills, backpressure holds (then pauses) intake, and the rest stays in Kafka."""

    name = "gate"

    def __init__(self) -> None:
        self.opened = threading.Event()

    def before_inference(self, decoded: Sequence[Decoded]) -> None:
        self.opened.wait(timeout=120)

    def after_inference(self, records: Sequence[SourceRecord], docs: list[dict[str, Any]]) -> list[bool]:
        return [True] * len(docs)

    def close(self) -> None:
        self.opened.set()


def _holding(worker: Any) -> bool:
    return worker.backpressure.state is not Intake.OPEN


def _lag(url: str, topic: str) -> float | None:
    samples = S.from_text(http_get(url + "/metrics")[2])
    series = samples.get("tidebatch_consumer_lag_messages", {})
    values = [v for labels, v in series.items() if dict(labels)["topic"] == topic]
    pipeline = samples.get("tidebatch_pipeline_lag_messages", {})
    if not values:
        return None
    assert sum(values) == sum(pipeline.values()), "the per-pipeline sum disagrees with the partitions"
    return sum(values)


def test_lag_gauge_counts_the_backlog_and_drains_to_zero(broker, topic_factory, unique_group_id):
    topics = make_topics(topic_factory, 1)
    produce_ctr(broker.bootstrap_servers, topics.input, N, seed=21)  # before the worker starts
    gate = Gate()
    # A small queue: backpressure holds intake after a few requests. A long
    # SLO: expired requests go to the late lane, which backpressure does not count.
    cfg = worker_config(
        broker, topics, unique_group_id, max_items=200,
        batching={"queue_high_rows": 200, "queue_low_rows": 100, "slo_ms": 600_000},
    )
    with live_worker(cfg, hooks=[gate]) as live:
        try:
            wait_for(lambda: _holding(live.worker), 60, "backpressure to hold intake")

            def settled() -> tuple[float, int] | None:
                consumed = live.worker.stats.consumed
                lag = _lag(live.url, topics.input)
                # One partition, fresh topic, nothing committed: position == consumed.
                return (lag, consumed) if lag == N - consumed else None

            lag, consumed = wait_for(settled, 30, f"lag == {N} - consumed")
            # one poll, plus a record per trickle interval until the hard limit pauses
            assert consumed <= 1100, f"the worker consumed {consumed} of {N} before holding"
            assert lag >= N - 1100  # nearly all of the backlog is still in Kafka
        finally:
            gate.opened.set()
        wait_for(lambda: _lag(live.url, topics.input) == 0, 120, "the lag to fall to 0")
        wait_for(lambda: live.worker.stats.scored == N, 120, f"all {N} requests scored")


def test_lag_counts_arrivals_while_backpressure_pauses(broker, topic_factory, unique_group_id):
    topics = make_topics(topic_factory, 1)
    first, more = 2000, 1000
    produce_ctr(broker.bootstrap_servers, topics.input, first, seed=22)
    gate = Gate()
    cfg = worker_config(
        broker, topics, unique_group_id, max_items=200,
        batching={"queue_high_rows": 200, "queue_low_rows": 100, "slo_ms": 600_000},
    )
    with live_worker(cfg, hooks=[gate]) as live:
        try:
            # The gate stalls the model: the trickled records do not drain, so the hold
            # turns into a pause and consumption stops (batching/backpressure.py).
            wait_for(lambda: live.worker.backpressure.state is Intake.PAUSED, 60,
                     "a stalled model to pause intake")
            consumed = live.worker.stats.consumed
            wait_for(lambda: _lag(live.url, topics.input) == first - consumed, 30, "the first backlog")
            produce_ctr(broker.bootstrap_servers, topics.input, more, seed=22, start=first)
            # 90 %: on the embedded broker only ListOffsets can see past the last fetch,
            # and it answers "start of the last batch + 1".
            expected = 0.9 * (first + more - consumed)
            wait_for(lambda: (_lag(live.url, topics.input) or 0) >= expected, 8,
                     "the lag gauge to count requests that arrived during the pause")
        finally:
            gate.opened.set()
