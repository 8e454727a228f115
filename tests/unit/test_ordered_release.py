"""consumers/release.py: outcomes leave in offset order per partition, so a transaction
only ever commits a prefix of each partition's offsets (docs/DELIVERY.md)."""

from __future__ import annotations

from consumers.release import OrderedRelease, Submitted

A, B = ("t", 0), ("t", 1)


def test_an_outcome_waits_for_every_earlier_offset_of_its_partition() -> None:
    order: OrderedRelease[str] = OrderedRelease()
    order.track([(A, 10), (A, 11), (A, 12), (B, 5)])
    assert order.submit(A, 12, "a12") is Submitted.QUEUED
    assert order.submit(B, 5, "b5") is Submitted.QUEUED
    assert order.take() == ["b5"]  # A's 12 waits for 10 and 11
    assert order.released() == {B: 6}
    assert order.submit(A, 10, "a10") is Submitted.QUEUED
    assert order.take() == ["a10"]
    assert order.submit(A, 11, None) is Submitted.QUEUED  # an outcome without a record
    assert order.take() == ["a12"]
    assert order.released() == {A: 13, B: 6}
    assert order.waiting() == 0


def test_offsets_need_not_be_contiguous() -> None:
    """Transaction markers and compaction leave gaps in a partition's offsets."""
    order: OrderedRelease[str] = OrderedRelease()
    order.track([(A, 0), (A, 2), (A, 7)])
    for offset in (7, 2, 0):
        order.submit(A, offset, f"a{offset}")
    assert order.take() == ["a0", "a2", "a7"]
    assert order.released() == {A: 8}


def test_a_second_outcome_for_a_released_offset_is_reported_as_such() -> None:
    order: OrderedRelease[str] = OrderedRelease()
    order.track([(A, 0)])
    order.submit(A, 0, "result")
    assert order.take() == ["result"]
    assert order.submit(A, 0, "its dead letter") is Submitted.RELEASED
    assert order.take() == []


def test_a_forgotten_partition_releases_nothing_more() -> None:
    order: OrderedRelease[str] = OrderedRelease()
    order.track([(A, 0), (A, 1), (B, 0)])
    order.submit(A, 1, "a1")
    order.forget([A])
    assert order.submit(A, 0, "a0") is Submitted.UNKNOWN
    assert order.take() == []
    assert order.released() == {}
    assert order.partitions() == [B]


def test_offsets_tracked_twice_or_already_released_are_ignored() -> None:
    """A poll after a seek back hands over offsets that are in flight or released."""
    order: OrderedRelease[str] = OrderedRelease()
    order.track([(A, 0), (A, 1)])
    order.submit(A, 0, "a0")
    order.take()
    order.track([(A, 0), (A, 1), (A, 2)])
    assert order.waiting() == 2  # 1 and 2
    assert order.submit(A, 5, "a5") is Submitted.UNKNOWN
