"""Release items numbered 0, 1, 2, ... in number order, whatever order they arrive in.

The worker's publisher uses it: with several batches in flight, executors hand their
finished batches over in the order they win the GIL, not the order the batches were
dispatched, and one key's results (one camera's frames) must leave in dispatch order.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Reorder(Generic[T]):
    def __init__(self) -> None:
        self._waiting: dict[int, T] = {}
        self._next = 0

    def add(self, seq: int, item: T) -> list[T]:
        """Take item number ``seq``; return the items that are now next in line."""
        if seq < self._next or seq in self._waiting:
            raise ValueError(f"item {seq} was already added")
        self._waiting[seq] = item
        ready: list[T] = []
        while self._next in self._waiting:
            ready.append(self._waiting.pop(self._next))
            self._next += 1
        return ready

    def rest(self) -> list[T]:
        """Everything still waiting for an earlier number, in number order (at shutdown
        after a failure that lost a number: better out of order than never)."""
        items = [self._waiting[seq] for seq in sorted(self._waiting)]
        self._waiting.clear()
        return items

    def __len__(self) -> int:
        return len(self._waiting)
