"""pipeline/delivery/transactions.py with a scripted transactional producer: what each
transaction holds, what it commits, and what an abort does (docs/DELIVERY.md)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from consumers.offsets import OffsetTracker
from consumers.records import AckCallback, SendError, SourceRecord, TopicPartition, TransactionError
from pipeline.delivery.lifecycle import Lifecycle
from pipeline.delivery.limits import Limits
from pipeline.delivery.outcomes import Outcomes, Topics
from pipeline.delivery.stats import WorkerStats
from pipeline.delivery.transactions import Transactions
from pipeline.observe.metrics import WorkerMetrics

TOPICS = Topics("res", "req.dlq", "req.late")


class FakeProducer:
    """Records what is produced into which transaction. `fail_topics`: records to these
    topics fail delivery at flush (a broker error); `refuse_topics`: refused at once."""

    max_record_bytes = 1_000_000

    def __init__(self) -> None:
        self.txn: list[tuple[str, bytes | None]] = []
        self.committed: list[tuple[list[tuple[str, bytes | None]], dict[TopicPartition, int]]] = []
        self.aborted: list[list[tuple[str, bytes | None]]] = []
        self.pending: list[tuple[str, AckCallback]] = []
        self.fail_topics: set[str] = set()
        self.refuse_topics: set[str] = set()
        self.commit_errors: list[TransactionError] = []
        self.abort_errors: list[TransactionError] = []
        self.init_errors: list[TransactionError] = []
        self.begun = 0
        self.renewed = 0

    def send(self, topic, key, value, headers, on_ack) -> None:
        if topic in self.refuse_topics:
            on_ack(SendError("too large", refused=True))
            return
        self.txn.append((topic, value))
        self.pending.append((topic, on_ack))

    def poll(self, timeout: float = 0.0) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        pending, self.pending = self.pending, []
        for topic, on_ack in pending:
            on_ack(SendError("broker down") if topic in self.fail_topics else None)
        return 0

    def init_transactions(self, timeout: float) -> None:
        if self.init_errors:
            raise self.init_errors.pop(0)

    def renew(self) -> None:
        # A new client: the old one's queue and open transaction are gone, unreported.
        self.renewed += 1
        self.pending = []
        self.txn = []

    def begin_transaction(self) -> None:
        self.begun += 1
        self.txn = []

    def commit_transaction(self, offsets: Mapping[TopicPartition, int], group_metadata: object, timeout: float) -> None:
        assert group_metadata == "generation-7"
        if self.commit_errors:
            raise self.commit_errors.pop(0)
        self.committed.append((self.txn, dict(offsets)))

    def abort_transaction(self, timeout: float) -> None:
        if self.abort_errors:
            raise self.abort_errors.pop(0)
        for _topic, on_ack in self.pending:  # librdkafka purges what is still queued
            on_ack(SendError("purged"))
        self.pending = []
        self.aborted.append(self.txn)


class FakeSource:
    member = True  # class attributes: tests change them for the one source the rig joins with
    offsets: dict[TopicPartition, int] = {}  # the group's committed offsets

    @staticmethod
    def committed(tps, timeout: float) -> dict[TopicPartition, int]:
        return {tp: o for tp, o in FakeSource.offsets.items() if tp in tps}

    def group_metadata(self) -> object:
        return "generation-7"

    def in_group(self) -> bool:
        return FakeSource.member


class Rig:
    def __init__(self) -> None:
        FakeSource.offsets = {}
        self.producer = FakeProducer()
        self.tracker = OffsetTracker()
        self.failures: list[str] = []
        self.lifecycle = Lifecycle()
        self.lifecycle.source = FakeSource()  # type: ignore[assignment]
        self.lifecycle.assigned = [("req", p) for p in range(4)]  # every partition the tests consume
        self.slept: list[float] = []
        metrics = WorkerMetrics("ctr", "adaptive")
        self.txns = Transactions(
            self.producer, self.lifecycle, self.tracker, [], 0.1, metrics, "ctr", WorkerStats(), self.failures.append,
            sleep=self.slept.append,
        )
        limits = Limits(request_bytes=1_000_000, topic_bytes={}, producer_bytes=1_000_000, prefix_bytes=100)
        self.outcomes = Outcomes(
            self.producer, lambda rec: self.tracker.ack(rec.tp, rec.offset), TOPICS, limits,
            metrics=metrics, pipeline="ctr", fail=self.failures.append, transactions=self.txns,
        )
        self.txns.start()

    def consume(self, partition: int, *offsets: int) -> list[SourceRecord]:
        recs = [SourceRecord("req", partition, o, None, b'{"request_id": "r%d"}' % o, {}, None) for o in offsets]
        self.tracker.track_many([(r.tp, r.offset) for r in recs])
        self.txns.track(recs)
        return recs


def test_results_leave_in_offset_order_and_commit_with_their_offsets() -> None:
    rig = Rig()
    r0, r1, r2 = rig.consume(0, 0, 1, 2)
    rig.outcomes.result(r2, b"s2")
    rig.outcomes.result(r0, b"s0")
    rig.txns.release()
    assert rig.producer.txn == [("res", b"s0")]  # r2 waits for r1
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})]
    rig.outcomes.result(r1, b"s1")
    rig.txns.release()
    assert rig.txns.commit() is True
    assert rig.producer.committed[-1] == ([("res", b"s1"), ("res", b"s2")], {("req", 0): 3})
    assert rig.txns.commit() is True  # nothing new: no empty transaction
    assert len(rig.producer.committed) == 2 and not rig.failures


def test_offsets_wait_for_the_sinks() -> None:
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.tracker.add_acks(r0.tp, r0.offset, 1)  # a sink owes a durable row
    rig.outcomes.result(r0, b"s0")
    assert rig.txns.commit() is False  # the row is not durable: the transaction stays open
    assert rig.producer.committed == [] and rig.producer.aborted == []
    rig.tracker.ack(r0.tp, r0.offset)
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})]


def test_a_failed_delivery_aborts_and_the_same_records_go_into_the_next_transaction() -> None:
    rig = Rig()
    r0, r1 = rig.consume(0, 0, 1)
    (q0,) = rig.consume(1, 0)
    rig.outcomes.result(r0, b"s0")
    rig.outcomes.dead_letter(r1, "bad request", "decode")
    rig.outcomes.result(q0, b"t0")
    rig.producer.fail_topics = {"req.dlq"}
    assert rig.txns.commit() is False
    assert len(rig.producer.aborted) == 1
    # Produced again at once, in the same order, without scoring anything again.
    assert [t for t, _ in rig.producer.txn] == ["res", "req.dlq", "res"]
    rig.producer.fail_topics = set()
    assert rig.txns.commit() is True
    records, offsets = rig.producer.committed[-1]
    assert [t for t, _ in records] == ["res", "req.dlq", "res"]
    assert offsets == {("req", 0): 2, ("req", 1): 1}
    assert not rig.failures


def test_an_abort_drops_the_records_of_partitions_being_let_go() -> None:
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    (q0,) = rig.consume(1, 0)
    rig.outcomes.result(r0, b"s0")
    rig.outcomes.result(q0, b"t0")
    rig.producer.commit_errors = [TransactionError("fenced: generation changed", abortable=True)]
    assert rig.txns.commit(letting_go=[("req", 1)]) is False
    rig.txns.forget([("req", 1)])
    assert rig.producer.txn == [("res", b"s0")]  # partition 1 is replayed by its next owner
    rig.outcomes.result(q0, b"late outcome of a partition let go")
    rig.txns.release()
    assert rig.txns.commit() is True
    assert rig.producer.committed[-1] == ([("res", b"s0")], {("req", 0): 1})


def test_a_refused_result_is_replaced_by_its_dead_letter_for_good() -> None:
    """After an abort the dead letter is produced again, not the refused result: an
    abort never loops on a record Kafka refuses."""
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.producer.refuse_topics = {"res"}
    rig.outcomes.result(r0, b"s0")
    rig.txns.release()
    assert [t for t, _ in rig.producer.txn] == ["req.dlq"]
    rig.producer.refuse_topics = set()
    rig.producer.commit_errors = [TransactionError("a record failed", abortable=True)]
    assert rig.txns.commit() is False
    assert [t for t, _ in rig.producer.txn] == ["req.dlq"]
    assert rig.txns.commit() is True
    assert [t for t, _ in rig.producer.committed[-1][0]] == ["req.dlq"]


def test_a_retriable_commit_error_is_retried() -> None:
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.outcomes.result(r0, b"s0")
    rig.producer.commit_errors = [TransactionError("coordinator moving", retriable=True)]
    assert rig.txns.commit() is True
    assert rig.producer.aborted == [] and len(rig.producer.committed) == 1


def test_a_fenced_producer_is_renewed_and_its_records_commit_in_the_new_ones_transaction() -> None:
    """What a cluster that lost its quorum left (issue 49): an epoch bump cut short, so
    the producer is fenced. A new client with the same transactional.id takes over, its
    init_transactions retried until the coordinator answers; nothing is aborted by
    hand (the new client's init aborts the old one's transaction) and nothing is lost."""
    rig = Rig()
    (r0, r1) = rig.consume(0, 0, 1)
    rig.outcomes.result(r0, b"s0")
    rig.producer.commit_errors = [TransactionError("producer fenced", fatal=True)]
    rig.producer.init_errors = [TransactionError("coordinator not available", retriable=True)] * 2
    assert rig.txns.commit() is False
    assert not rig.failures and rig.producer.renewed == 1
    assert rig.producer.aborted == [] and rig.slept == [1.0, 1.0]
    assert rig.producer.txn == [("res", b"s0")]  # produced again in the new transaction
    rig.outcomes.result(r1, b"s1")
    rig.txns.release()
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0"), ("res", b"s1")], {("req", 0): 2})]


def test_a_commit_that_went_through_unanswered_is_not_produced_again() -> None:
    """A commit call that did not return in time is given up (fatal) and the producer
    renewed; had the coordinator committed it meanwhile, the group's committed offsets
    say so and its records are not produced again: no read_committed duplicate."""
    rig = Rig()
    (r0, r1) = rig.consume(0, 0, 1)
    rig.outcomes.result(r0, b"s0")
    rig.outcomes.result(r1, b"s1")

    def committed_unanswered(offsets, group_metadata, timeout) -> None:
        rig.producer.committed.append((rig.producer.txn, dict(offsets)))
        FakeSource.offsets = dict(offsets)
        raise TransactionError("commit_transaction: librdkafka did not return within 35 s", fatal=True)

    rig.producer.commit_transaction = committed_unanswered  # type: ignore[method-assign]
    assert rig.txns.commit() is False
    assert rig.producer.renewed == 1 and not rig.failures
    assert rig.producer.txn == []  # nothing produced again
    del rig.producer.commit_transaction  # the class's again
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0"), ("res", b"s1")], {("req", 0): 2})]


def test_an_abort_that_fails_renews_the_producer() -> None:
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.outcomes.result(r0, b"s0")
    rig.producer.fail_topics = {"res"}  # timed out records: the transaction must abort
    rig.producer.abort_errors = [TransactionError("abort timed out", retriable=True),
                                 TransactionError("fenced by a newer instance", fatal=True)]
    assert rig.txns.commit() is False
    assert rig.producer.renewed == 1 and not rig.failures and rig.slept == [1.0]
    rig.producer.fail_topics = set()
    assert rig.producer.txn == [("res", b"s0")]
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})]


def test_a_producer_fenced_again_and_again_stops_the_worker_and_commits_nothing_more() -> None:
    # Another live process with our transactional.id: renewing for ever would have the
    # two fence each other. After MAX_RENEWALS in the window the worker stops.
    from pipeline.delivery.transactions import MAX_RENEWALS

    rig = Rig()
    (r0, r1) = rig.consume(0, 0, 1)
    rig.outcomes.result(r0, b"s0")
    for _ in range(MAX_RENEWALS + 1):
        rig.producer.commit_errors = [TransactionError("producer fenced", fatal=True)]
        assert rig.txns.commit() is False
    assert rig.producer.renewed == MAX_RENEWALS
    assert len(rig.failures) == 1 and "producer fenced" in rig.failures[0]
    rig.outcomes.result(r1, b"s1")
    rig.txns.release()
    assert rig.txns.commit() is False
    assert rig.producer.committed == [] and ("res", b"s1") not in rig.producer.txn


def test_a_stop_while_the_cluster_is_away_ends_the_renewal() -> None:
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.outcomes.result(r0, b"s0")
    rig.producer.commit_errors = [TransactionError("producer fenced", fatal=True)]

    def refuse(timeout: float) -> None:
        rig.lifecycle.stop("signal SIGTERM")  # arrives while init_transactions waits
        raise TransactionError("coordinator not available", retriable=True)

    rig.producer.init_transactions = refuse  # type: ignore[method-assign]
    assert rig.txns.commit() is False
    assert len(rig.failures) == 1 and rig.producer.committed == []


@pytest.mark.parametrize("dropped", [True, False])
def test_an_outcome_without_a_record_still_moves_the_offset(dropped: bool) -> None:
    rig = Rig()
    r0, r1 = rig.consume(0, 0, 1)
    rig.outcomes.settle(r0)  # a replay a hook dropped
    if dropped:
        rig.outcomes.settle(r1)
    else:
        rig.outcomes.result(r1, b"s1")
    assert rig.txns.commit() is True
    records, offsets = rig.producer.committed[-1]
    assert offsets == {("req", 0): 2}
    assert records == ([] if dropped else [("res", b"s1")])


def test_a_producer_that_cannot_start_transactions_is_one_line() -> None:
    from pipeline.errors import UserError

    rig = Rig()

    def refuse(timeout: float) -> None:
        raise TransactionError("init_transactions: Broker: Transactional Id authorization failed", fatal=True)

    rig.producer.init_transactions = refuse  # type: ignore[method-assign]
    with pytest.raises(UserError, match="cannot start transactions: .*authorization failed"):
        rig.txns.start()


def test_a_member_whose_session_expired_aborts_instead_of_committing_its_offsets() -> None:
    """A zombie woken after its session expired: librdkafka has forgotten its member id,
    and offsets sent without member id and generation are taken unchecked by the broker
    (KIP-447), past what the new owner committed. One request got two committed results
    that way in test_exactly_once.py's zombie case, once in CI."""
    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.outcomes.result(r0, b"s0")
    FakeSource.member = False
    try:
        assert rig.txns.commit() is False
        assert rig.producer.committed == [] and rig.producer.aborted == [[("res", b"s0")]]
        # Back in the group (its partitions kept): the record goes into the next transaction.
        FakeSource.member = True
        assert rig.txns.commit() is True
        assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})]
        # Partitions lost while out of the group are let go with their records.
        (r1,) = rig.consume(1, 0)
        rig.outcomes.result(r1, b"t0")
        FakeSource.member = False
        assert rig.txns.commit(letting_go=[("req", 1)]) is False
        FakeSource.member = True
        assert rig.txns.commit() is True and len(rig.producer.committed) == 1 and not rig.failures
    finally:
        FakeSource.member = True


def test_membership_is_checked_after_the_metadata_is_taken() -> None:
    """librdkafka may forget the member id between the membership check and the
    metadata: checked first, the metadata could then carry no member id and no
    generation, which the broker takes unchecked."""

    class Forgetting:
        member = True

        @classmethod
        def group_metadata(cls) -> object:
            cls.member = False  # the session timeout fires right here
            return "generation-7"

        @classmethod
        def in_group(cls) -> bool:
            return cls.member

    rig = Rig()
    rig.lifecycle.source = Forgetting  # type: ignore[assignment]
    (r0,) = rig.consume(0, 0)
    rig.outcomes.result(r0, b"s0")
    assert rig.txns.commit() is False
    assert rig.producer.committed == [] and rig.producer.aborted == [[("res", b"s0")]]


def test_records_of_a_partition_the_worker_does_not_own_never_commit() -> None:
    """Records of a partition a rebalance let go can still come in (a consumer that
    returns records fetched before the callback: consumers/confluent_backend.py). Back
    in the group, the worker's offsets pass the broker's generation check whatever
    partitions they name, so the transaction itself refuses them: with records of such
    a partition in it, it aborts and produces only the others again."""
    rig = Rig()
    rig.lifecycle.assigned = [("req", 0)]
    (r0,) = rig.consume(0, 0)
    (q0,) = rig.consume(1, 0)  # partition 1 is not the worker's
    rig.outcomes.result(r0, b"s0")
    rig.outcomes.result(q0, b"t0")
    assert rig.txns.commit() is False
    assert rig.producer.aborted == [[("res", b"s0"), ("res", b"t0")]] and rig.producer.committed == []
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})]
    q1 = SourceRecord("req", 1, 1, None, b'{"request_id": "r1"}', {}, None)
    rig.outcomes.result(q1, b"t1")  # a late outcome of the partition let go: dropped
    assert rig.txns.commit() is True and len(rig.producer.committed) == 1 and not rig.failures


def test_a_partition_not_owned_without_records_yet_is_forgotten_and_the_rest_commits() -> None:
    rig = Rig()
    rig.lifecycle.assigned = [("req", 0)]
    (r0,) = rig.consume(0, 0)
    rig.consume(1, 0)  # tracked, no outcome yet, not owned
    rig.outcomes.result(r0, b"s0")
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})] and rig.producer.aborted == []


def test_an_abort_retriable_for_ever_renews_the_producer() -> None:
    # librdkafka answered "Conflicting commit_transaction API call is already in
    # progress" (retriable) to every abort after a commit that timed out: the worker
    # sat in that loop until the test gave up (issue 49). Bounded, then renewed.
    from pipeline.delivery.transactions import ABORT_ATTEMPTS

    rig = Rig()
    (r0,) = rig.consume(0, 0)
    rig.outcomes.result(r0, b"s0")
    rig.producer.fail_topics = {"res"}
    conflict = TransactionError("abort_transaction: Conflicting commit_transaction API call is already in progress",
                                retriable=True)
    rig.producer.abort_errors = [conflict] * (ABORT_ATTEMPTS + 5)
    assert rig.txns.commit() is False
    assert rig.producer.renewed == 1 and len(rig.slept) == ABORT_ATTEMPTS - 1 and not rig.failures
    rig.producer.fail_topics = set()
    rig.producer.abort_errors = []
    assert rig.txns.commit() is True
    assert rig.producer.committed == [([("res", b"s0")], {("req", 0): 1})]
