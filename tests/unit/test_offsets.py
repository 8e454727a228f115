from consumers.offsets import OffsetTracker

TP = ("t", 0)


def test_watermark_is_contiguous_done_prefix() -> None:
    tr = OffsetTracker()
    for off in range(5):
        tr.track(TP, off)
    tr.ack(TP, 1)
    tr.ack(TP, 2)
    assert tr.committable() == {}  # offset 0 still in flight: nothing may be committed
    tr.ack(TP, 0)
    assert tr.committable() == {TP: 3}  # next offset to consume after 0..2
    tr.committed({TP: 3})
    assert tr.committable() == {}  # confirmed watermarks are not re-committed
    tr.ack(TP, 4)
    assert tr.committable() == {}
    tr.ack(TP, 3)
    assert tr.committable() == {TP: 5}
    assert tr.pending(TP) == 0


def test_multiple_acks_needed_before_done() -> None:
    tr = OffsetTracker()
    tr.track(TP, 10)
    tr.add_acks(TP, 10, 1)  # e.g. the Parquet sink joins the Kafka result
    tr.ack(TP, 10)
    assert tr.committable() == {}
    tr.ack(TP, 10)
    assert tr.committable() == {TP: 11}


def test_partitions_are_independent() -> None:
    tr = OffsetTracker()
    a, b = ("t", 0), ("t", 1)
    tr.track(a, 0)
    tr.track(b, 7)
    tr.ack(b, 7)
    assert tr.committable() == {b: 8}
    assert tr.pending(a) == 1


def test_forget_drops_revoked_partition_and_ignores_late_acks() -> None:
    tr = OffsetTracker()
    tr.track(TP, 0)
    tr.forget([TP])
    tr.ack(TP, 0)  # a result delivered after the revoke must not resurrect it
    assert tr.committable() == {}
    assert tr.partitions() == []


def test_redelivered_offset_in_flight_is_tracked_once() -> None:
    tr = OffsetTracker()
    tr.track(TP, 0)
    tr.track(TP, 0)
    tr.ack(TP, 0)
    assert tr.committable() == {TP: 1}


def test_track_many_equals_track_one_by_one() -> None:
    a, b = OffsetTracker(), OffsetTracker()
    offsets = [(TP, 0), (("t", 1), 5), (TP, 1), (TP, 1)]
    a.track_many(offsets)
    for tp, off in offsets:
        b.track(tp, off)
    for tr in (a, b):
        tr.ack(TP, 0)
        tr.ack(TP, 1)
    assert a.committable() == b.committable() == {TP: 2}
    assert a.pending() == b.pending() == 1


def test_a_commit_that_failed_is_offered_again() -> None:
    """committable() used to mark what it returned as committed: a commit refused during
    a rebalance (ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS) was never retried, and the
    partition's next owner replayed everything since the last commit that worked."""
    tr = OffsetTracker()
    tr.track(TP, 0)
    tr.ack(TP, 0)
    assert tr.committable() == {TP: 1}
    # ...the commit failed: nothing confirmed
    assert tr.committable() == {TP: 1}
    tr.committed({TP: 1})
    assert tr.committable() == {}


def test_committing_some_partitions_leaves_the_others_offered() -> None:
    """A revoke commits only the revoked partitions; the others' watermarks must still
    be offered at the next interval."""
    tr = OffsetTracker()
    a, b = ("t", 0), ("t", 1)
    for tp in (a, b):
        tr.track(tp, 0)
        tr.ack(tp, 0)
    taken = tr.committable()
    tr.committed({a: taken[a]})  # only the revoked partition a was committed
    assert tr.committable() == {b: 1}


def test_an_older_confirmation_never_moves_the_committed_watermark_back() -> None:
    tr = OffsetTracker()
    for off in range(3):
        tr.track(TP, off)
        tr.ack(TP, off)
    tr.committed({TP: 3})
    tr.committed({TP: 1})  # an earlier asynchronous commit answered late
    assert tr.committable() == {}


def test_pending_drops_done_offsets_without_a_commit() -> None:
    # Partitions.on_revoke waits while pending(tp) > 0: offsets acked since the last
    # committable() must not count, or every revoke under traffic waited its full 10 s.
    tr = OffsetTracker()
    for off in range(3):
        tr.track(TP, off)
    tr.ack(TP, 1)
    assert tr.pending(TP) == 3  # offset 0 still in flight holds 1 back too
    tr.ack(TP, 0)
    assert tr.pending(TP) == 1
    tr.ack(TP, 2)
    assert tr.pending(TP) == 0 and tr.pending() == 0
    assert tr.committable() == {TP: 3}  # the watermark is still offered for commit
