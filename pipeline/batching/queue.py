"""Request storage for the batching core: per shape bucket, per priority level, a heap
ordered either by arrival (FIFO) or by deadline (EDF). Pure data structure: no clock,
no locks, no I/O."""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Literal

from pipeline.batching.request import Request, edf_deadline

Ordering = Literal["fifo", "edf"]


class RequestQueue:
    def __init__(self, ordering: Ordering = "fifo") -> None:
        if ordering not in ("fifo", "edf"):
            raise ValueError(f"ordering must be 'fifo' or 'edf', not {ordering!r}")
        self.ordering = ordering
        # bucket -> priority -> heap of (key, seq, request)
        self._heaps: dict[Hashable, dict[int, list[tuple[float, int, Request]]]] = {}
        self._rows_by_bucket: dict[Hashable, int] = {}
        self._rows = 0
        self._count = 0
        self._seq = 0

    # -- size ---------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self._rows

    def __len__(self) -> int:
        return self._count

    def bucket_rows(self, bucket: Hashable) -> int:
        return self._rows_by_bucket.get(bucket, 0)

    def buckets(self) -> list[Hashable]:
        # By non-empty heaps, not by rows: a zero-row request must not become invisible.
        return [b for b, by_prio in self._heaps.items() if by_prio]

    # -- mutation -------------------------------------------------------------
    def push(self, req: Request) -> None:
        self._seq += 1
        req.seq = self._seq
        key = edf_deadline(req) if self.ordering == "edf" else float(req.seq)
        by_prio = self._heaps.setdefault(req.bucket, {})
        heapq.heappush(by_prio.setdefault(req.priority, []), (key, req.seq, req))
        self._rows_by_bucket[req.bucket] = self._rows_by_bucket.get(req.bucket, 0) + req.rows
        self._rows += req.rows
        self._count += 1

    def _pop(self, bucket: Hashable, priority: int) -> Request:
        heap = self._heaps[bucket][priority]
        _, _, req = heapq.heappop(heap)
        if not heap:
            del self._heaps[bucket][priority]
        self._rows_by_bucket[bucket] -= req.rows
        self._rows -= req.rows
        self._count -= 1
        return req

    def take(self, bucket: Hashable, max_rows: int, fits=None) -> list[Request]:
        """Pop requests of one bucket, best priority first and in queue order within
        it, while the batch stays within max_rows (the first request is always taken,
        even if larger: a request is never split). `fits(rows_after, req)` may veto
        adding a further request (the deadline cap); taking stops at the first veto."""
        out: list[Request] = []
        rows = 0
        by_prio = self._heaps.get(bucket, {})
        for prio in sorted(by_prio):
            heap = by_prio.get(prio)
            while heap:
                req = heap[0][2]
                if out and (rows + req.rows > max_rows or (fits and not fits(rows + req.rows, req))):
                    return out
                out.append(self._pop(bucket, prio))
                rows += req.rows
                heap = by_prio.get(prio)
        return out

    def pop_while(self, bucket: Hashable, predicate) -> list[Request]:
        """Pop, from the top of each priority heap of a bucket, requests for which
        predicate(req) holds. With EDF ordering the top is the tightest own deadline
        (`due`), so this removes the requests that can no longer make theirs; one whose
        tightened `deadline` is earlier than a request above it (the answer tail grew
        between their polls) waits until it reaches the top."""
        out: list[Request] = []
        by_prio = self._heaps.get(bucket, {})
        for prio in list(by_prio):
            while (heap := by_prio.get(prio)) and predicate(heap[0][2]):
                out.append(self._pop(bucket, prio))
        return out

    def pop_head(self, bucket: Hashable) -> Request | None:
        head = self.head(bucket)
        if head is None:
            return None
        return self._pop(bucket, head.priority)

    # -- inspection -----------------------------------------------------------
    def head(self, bucket: Hashable) -> Request | None:
        """The request this bucket would serve first (best priority, queue order)."""
        by_prio = self._heaps.get(bucket)
        if not by_prio:
            return None
        return by_prio[min(by_prio)][0][2]

    def heads(self) -> Iterator[Request]:
        for bucket in self.buckets():
            head = self.head(bucket)
            if head is not None:
                yield head

    def oldest_arrival(self, bucket: Hashable) -> float | None:
        """Arrival of the oldest queued request of a bucket, whatever its priority."""
        oldest = None
        for heap in self._heaps.get(bucket, {}).values():
            if self.ordering == "fifo":
                t = heap[0][2].arrival
            else:
                t = min(entry[2].arrival for entry in heap)
            oldest = t if oldest is None else min(oldest, t)
        return oldest

    def earliest_deadline(self, bucket: Hashable) -> float | None:
        """The tightest `deadline` queued in a bucket: the one the batcher holds, not
        the EDF key (`due`, request.py edf_deadline), which the worker's answer tail
        leaves later by an amount that changes from poll to poll, so the top of an EDF
        heap need not hold it."""
        best = None
        for heap in self._heaps.get(bucket, {}).values():
            t = min(entry[2].deadline for entry in heap)
            best = t if best is None else min(best, t)
        return best

    def drain(self) -> list[Request]:
        out: list[Request] = []
        for bucket in list(self._heaps):
            while (req := self.pop_head(bucket)) is not None:
                out.append(req)
        return out
