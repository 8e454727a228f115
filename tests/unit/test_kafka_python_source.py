"""KafkaPythonSource's handling of kafka-python 3's group membership:

- it fetches its topics' metadata before it subscribes: kafka-python 3 joins a group
  without waiting for a subscription's metadata, and a leader that assigned before
  the metadata arrived gave its group nothing ("worker never got partitions" in CI;
  bench/kafka_python_join.py reproduces it under load);
- rebalance listeners run on kafka-python's IO thread, where a synchronous commit is
  refused: the source hands revokes and assignments to the worker from poll_batch(),
  in the polling thread, and drops records fetched for a partition revoked meanwhile;
- a group join is waited for in one call (kafka-python 3.0.12 drops a join that ends
  after the poll waiting on it gave up, so 20 ms polls under load never settled), and
  one stuck mid-rebalance for 20 s is started again.
"""

from __future__ import annotations

from typing import Any

from kafka.consumer.fetcher import ConsumerRecord
from kafka.structs import TopicPartition as KpTopicPartition

from consumers import kafka_python_backend as kp
from consumers.kafka_python_backend import KafkaPythonSource


class _Coordinator:
    def __init__(self, consumer: _FakeConsumer) -> None:
        self.consumer = consumer
        self.rejoin = False
        self.polls: list[int] = []
        self.revokes_on_join: list[KpTopicPartition] = []
        self.rebalancing = False
        self._join_task: object | None = None

    def need_rejoin(self) -> bool:
        return self.rejoin

    def rebalance_in_progress(self) -> bool:
        return self.rebalancing

    def request_rejoin(self) -> None:
        self.rejoin = True

    def poll(self, timeout_ms: int) -> bool:
        self.polls.append(timeout_ms)
        self.rejoin = False
        if self.revokes_on_join:  # a cooperative join ends by revoking what moves
            self.consumer.listener.on_partitions_revoked(set(self.revokes_on_join))
            self.revokes_on_join = []
        return True


class _FakeConsumer:
    """Records calls; poll() plays a scripted rebalance through the listener, on the
    calling thread here (kafka-python runs it on its IO thread)."""

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.calls: list[tuple[str, Any]] = []
        self.listener: Any = None
        self._coordinator = _Coordinator(self)
        self.during_poll: list[tuple[str, list[KpTopicPartition]]] = []
        self.records: dict[KpTopicPartition, list[Any]] = {}
        self.paused_parts: list[KpTopicPartition] = []

    def partitions_for_topic(self, topic: str) -> set[int]:
        self.calls.append(("metadata", topic))
        return {0, 1}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.calls.append(("subscribe", tuple(topics)))
        self.listener = listener

    def pause(self, *parts: KpTopicPartition) -> None:
        self.paused_parts.extend(parts)

    def assignment(self) -> set[KpTopicPartition]:
        return set()

    def poll(self, timeout_ms: int, max_records: int) -> dict[KpTopicPartition, list[Any]]:
        self.calls.append(("poll", timeout_ms))
        for kind, parts in self.during_poll:
            getattr(self.listener, f"on_partitions_{kind}")(set(parts))
        self.during_poll = []
        records, self.records = self.records, {}
        return records


def _record(offset: int, timestamp_type: int = 0, headers: list | None = None) -> ConsumerRecord:
    """A record as kafka-python's fetcher hands it over (timestamp_type 0: CreateTime)."""
    return ConsumerRecord("a", 0, -1, offset, 1, timestamp_type, None, b"{}", headers or [], None, -1, 2, -1)


def _source(events: list[tuple[str, list]]) -> KafkaPythonSource:
    def on_assign(tps: list) -> None:
        events.append(("assign", tps))

    def on_revoke(tps: list) -> None:
        events.append(("revoke", tps))

    return KafkaPythonSource({"group_id": "g"}, ["a", "b"], on_assign, on_revoke, consumer_factory=_FakeConsumer)


def test_the_topics_metadata_is_fetched_before_the_group_is_joined():
    source = _source([])
    consumer = source._consumer
    assert consumer.config == {"group_id": "g"}
    # After subscribe: the fetch then also fills the coordinator's metadata snapshot.
    assert consumer.calls == [("subscribe", ("a", "b")), ("metadata", "a"), ("metadata", "b")]


def test_rebalances_reach_the_worker_after_poll_returns_in_order_and_revoked_records_are_dropped():
    events: list = []
    source = _source(events)
    consumer = source._consumer
    a0, a1 = KpTopicPartition("a", 0), KpTopicPartition("a", 1)
    consumer.during_poll = [("revoked", [a0]), ("assigned", [a1])]
    consumer.records = {a0: [_record(5)], a1: [_record(7)]}
    got = source.poll_batch(100, 0.02)
    assert events == [("revoke", [("a", 0)]), ("assign", [("a", 1)])]
    assert [(r.partition, r.offset) for r in got] == [(1, 7)]  # a-0's record belongs to its next owner


def test_a_partition_assigned_during_backpressure_starts_paused():
    source = _source([])
    consumer = source._consumer
    source.pause_all()
    b0 = KpTopicPartition("b", 0)
    consumer.during_poll = [("assigned", [b0])]
    source.poll_batch(100, 0.02)
    assert consumer.paused_parts == [b0]


def test_a_pending_group_join_is_waited_for_in_one_call_before_polling():
    source = _source([])
    consumer = source._consumer
    consumer._coordinator.rejoin = True
    source.poll_batch(100, 0.02)
    assert consumer._coordinator.polls == [kp._JOIN_WAIT_MS]
    source.poll_batch(100, 0.02)
    assert consumer._coordinator.polls == [kp._JOIN_WAIT_MS]  # joined: plain 20 ms polls again
    assert [c for c in consumer.calls if c[0] == "poll"] == [("poll", 20), ("poll", 20)]


def test_a_revoke_ending_a_join_is_committed_before_the_next_poll_can_rejoin():
    """The follow-up join that hands the partition to its next owner starts in poll():
    the worker's revoke (its commit) must have run before that."""
    source = KafkaPythonSource({}, ["a"], lambda _tps: None, lambda tps: consumer.calls.append(("revoke", tps)),
                               consumer_factory=_FakeConsumer)
    consumer = source._consumer
    consumer._coordinator.rejoin = True
    consumer._coordinator.revokes_on_join = [KpTopicPartition("a", 0)]
    source.poll_batch(100, 0.02)
    assert consumer.calls[-2:] == [("revoke", [("a", 0)]), ("poll", 20)]


def test_a_join_stuck_mid_rebalance_is_started_again(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(kp.time, "monotonic", lambda: now[0])
    source = _source([])
    coordinator = source._consumer._coordinator
    coordinator.rebalancing = True  # a member left mid-join: no rejoin asked for
    coordinator._join_task = stuck = object()
    source.poll_batch(100, 0.02)
    now[0] += kp._STUCK_JOIN_S - 1
    source.poll_batch(100, 0.02)
    assert coordinator.polls == [] and coordinator._join_task is stuck
    now[0] += 1
    source.poll_batch(100, 0.02)
    assert coordinator._join_task is None and coordinator.polls == [kp._JOIN_WAIT_MS]


def test_a_rebalance_that_ends_resets_the_stuck_clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(kp.time, "monotonic", lambda: now[0])
    source = _source([])
    coordinator = source._consumer._coordinator
    coordinator.rebalancing = True
    source.poll_batch(100, 0.02)
    coordinator.rebalancing = False
    now[0] += 15
    source.poll_batch(100, 0.02)
    coordinator.rebalancing = True
    now[0] += 15
    source.poll_batch(100, 0.02)
    assert coordinator.polls == []  # two short rebalances, not one stuck for 30 s


def test_a_commit_refused_mid_rebalance_finishes_the_join_and_commits_again():
    """A worker stopping during a rebalance polls no more: its final commit used to fail
    with RebalanceInProgressError, leaving its finished work uncommitted."""
    from kafka.errors import RebalanceInProgressError

    source = _source([])
    consumer = source._consumer
    commits: list[dict] = []

    def commit(parts):
        commits.append(parts)
        if len(commits) == 1:
            consumer._coordinator.rejoin = True
            raise RebalanceInProgressError("mid-rebalance")

    consumer.commit = commit
    source.commit({("a", 0): 12})
    assert len(commits) == 2 and consumer._coordinator.polls == [kp._JOIN_WAIT_MS]


def test_the_timestamp_type_reaches_the_record():
    """timestamp_type 1 is LogAppendTime (the broker's append): the worker splits the
    produce leg off only then (pipeline/worker/publisher.py)."""
    source = _source([])
    source._consumer.records = {
        KpTopicPartition("a", 0): [_record(5, timestamp_type=1, headers=[("tidebatch.produced_ms", b"0")]), _record(6)]
    }
    got = source.poll_batch(100, 0.02)
    assert [(r.offset, r.log_append_time, r.timestamp_ms) for r in got] == [(5, True, 1), (6, False, 1)]
    assert got[0].headers == {"tidebatch.produced_ms": b"0"}
