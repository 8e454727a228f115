"""At-least-once offset bookkeeping.

A consumed offset is done when every sink has acknowledged its outcome (the result,
DLQ or late record acked by Kafka; ETL rows durable). Offsets complete out of order —
batches of different buckets and priorities overtake each other — so each partition
commits only its contiguous watermark: the first offset that is not yet done.
"""

from __future__ import annotations

import threading
from collections import deque

TopicPartition = tuple[str, int]


class _PartitionState:
    __slots__ = ("order", "needs", "done_to", "committed")

    def __init__(self) -> None:
        self.order: deque[int] = deque()  # consumed offsets, in consumption order
        self.needs: dict[int, int] = {}  # offset -> acks still missing
        self.done_to: int | None = None  # one past the last contiguous done offset
        self.committed: int | None = None  # the last watermark Kafka confirmed as committed


class OffsetTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _PartitionState] = {}

    def track(self, tp: TopicPartition, offset: int, acks_needed: int = 1) -> None:
        """Record a consumed offset that needs `acks_needed` acknowledgements."""
        if acks_needed < 1:
            raise ValueError("acks_needed must be >= 1")
        with self._lock:
            st = self._parts.setdefault(tp, _PartitionState())
            if offset in st.needs:
                return  # redelivered while still in flight (seek back): one outcome is enough
            st.order.append(offset)
            st.needs[offset] = acks_needed

    def track_many(self, offsets: list[tuple[TopicPartition, int]]) -> None:
        """track() for a whole poll's worth of records, under one lock."""
        with self._lock:
            for tp, offset in offsets:
                st = self._parts.get(tp)
                if st is None:
                    st = self._parts[tp] = _PartitionState()
                if offset not in st.needs:
                    st.order.append(offset)
                    st.needs[offset] = 1

    def add_acks(self, tp: TopicPartition, offset: int, extra: int) -> None:
        """A sink discovered it owes more acknowledgements (e.g. one more file)."""
        with self._lock:
            st = self._parts.get(tp)
            if st and offset in st.needs:
                st.needs[offset] += extra

    def ack(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            st = self._parts.get(tp)
            if st is None or offset not in st.needs:
                return  # partition revoked meanwhile: its work no longer counts here
            st.needs[offset] -= 1

    def watermark(self, tp: TopicPartition) -> int | None:
        """The offset to commit for tp (one past the last contiguous done offset)."""
        with self._lock:
            return self._advance(tp)

    def _advance(self, tp: TopicPartition) -> int | None:
        st = self._parts.get(tp)
        if st is None:
            return None
        last_done: int | None = None
        while st.order and st.needs[st.order[0]] <= 0:
            last_done = st.order.popleft()
            del st.needs[last_done]
        if last_done is not None:
            st.done_to = last_done + 1
        return st.done_to

    def committable(self) -> dict[TopicPartition, int]:
        """Watermarks Kafka has not confirmed yet; commit them, then report success with
        committed(). Taking them marks nothing: a commit that fails (during a rebalance,
        say: ILLEGAL_GENERATION) is offered again next time instead of being lost until
        the watermark moves, which replayed results after every such rebalance."""
        out: dict[TopicPartition, int] = {}
        with self._lock:
            for tp, st in self._parts.items():
                wm = self._advance(tp)
                if wm is not None and wm != st.committed:
                    out[tp] = wm
        return out

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        """Kafka confirmed these watermarks (from committable()) as committed."""
        with self._lock:
            for tp, offset in offsets.items():
                st = self._parts.get(tp)
                if st is not None and (st.committed is None or offset > st.committed):
                    st.committed = offset

    def pending(self, tp: TopicPartition | None = None) -> int:
        """Offsets (of `tp`, or of every partition) not done yet: past the contiguous
        done prefix. Done offsets leave the count as soon as they are done, not at the
        next committable() or watermark(): a revoke waits on this count."""
        with self._lock:
            tps = [tp] if tp is not None else list(self._parts)
            for part in tps:
                self._advance(part)
            return sum(len(self._parts[part].order) for part in tps if part in self._parts)

    def forget(self, tps: list[TopicPartition]) -> None:
        """Drop partitions that were revoked; late acks for them are ignored."""
        with self._lock:
            for tp in tps:
                self._parts.pop(tp, None)

    def partitions(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._parts)
