"""Outcomes released in offset order, per partition: what a transaction may commit.

With delivery exactly_once (pipeline/delivery/transactions.py) a transaction commits the
input offset O of a partition together with the outcome records it holds, and O must
mean "every request before O has its outcome in this or an earlier transaction, and
none from O on does": a result of a request past O would be visible now and again
after the replay of everything from O. Batches finish out of offset order (buckets,
priorities, several in flight), so an outcome is *released* (handed to the producer)
only once every earlier consumed offset of its partition has been: the released
offsets always form a prefix, and the transaction commits its end.

Pure and thread-safe: outcomes are submitted from the publisher and the source thread;
only the source thread takes what is released.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from enum import Enum
from typing import Generic, TypeVar

TopicPartition = tuple[str, int]
T = TypeVar("T")


class Submitted(Enum):
    QUEUED = "queued"  # waits for earlier offsets, or is next in line
    RELEASED = "released"  # this offset's outcome was released already: a second one for it
    UNKNOWN = "unknown"  # not tracked: its partition was let go (revoked, or the transaction aborted)


class _Partition(Generic[T]):
    __slots__ = ("order", "ready", "released_to")

    def __init__(self) -> None:
        self.order: deque[int] = deque()  # tracked offsets not released yet, in consumption order
        self.ready: dict[int, list[T]] = {}  # offset -> its outcome items (none: no record)
        self.released_to: int | None = None  # one past the last released offset


class OrderedRelease(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _Partition[T]] = {}

    def track(self, offsets: Iterable[tuple[TopicPartition, int]]) -> None:
        """Consumed offsets, in consumption order; one already tracked is ignored."""
        with self._lock:
            for tp, offset in offsets:
                part = self._parts.get(tp)
                if part is None:
                    part = self._parts[tp] = _Partition()
                done = part.released_to is not None and offset < part.released_to
                if not done and (not part.order or offset > part.order[-1]):
                    part.order.append(offset)

    def submit(self, tp: TopicPartition, offset: int, item: T | None) -> Submitted:
        """The outcome of a tracked offset is ready: `item` to release, or None when the
        outcome has no record (a dropped replay)."""
        with self._lock:
            part = self._parts.get(tp)
            if part is None:
                return Submitted.UNKNOWN
            if part.released_to is not None and offset < part.released_to:
                return Submitted.RELEASED
            if not part.order or offset < part.order[0] or offset > part.order[-1]:
                return Submitted.UNKNOWN
            items = part.ready.setdefault(offset, [])
            if item is not None:
                items.append(item)
            return Submitted.QUEUED

    def take(self) -> list[T]:
        """The items now released: those whose offset is next in line, in offset order."""
        out: list[T] = []
        with self._lock:
            for part in self._parts.values():
                while part.order and part.order[0] in part.ready:
                    offset = part.order.popleft()
                    out.extend(part.ready.pop(offset))
                    part.released_to = offset + 1
        return out

    def released(self) -> dict[TopicPartition, int]:
        """Per partition, one past the last released offset: the offset to commit."""
        with self._lock:
            return {tp: p.released_to for tp, p in self._parts.items() if p.released_to is not None}

    def waiting(self) -> int:
        """Tracked offsets not released yet."""
        with self._lock:
            return sum(len(p.order) for p in self._parts.values())

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Let partitions go: what they still hold is never released."""
        with self._lock:
            for tp in tps:
                self._parts.pop(tp, None)

    def partitions(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._parts)
