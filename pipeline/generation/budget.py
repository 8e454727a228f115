"""The KV-cache memory budget of one decoder: a slot count (sequences held at once)
and a token budget (prompt + generated tokens of every active sequence). Pure."""

from __future__ import annotations

import heapq


class KvBudget:
    """Admission reserves a sequence's whole growth, prompt + max_new_tokens, so the
    tokens actually held never pass `max_tokens` however long each sequence runs.
    vLLM reserves less and preempts (swaps or recomputes a sequence) when memory runs
    out; without preemption a reservation is the only way to never run out mid-step.

    Each sequence holds a slot index, 0 .. max_slots - 1: the row of a decoder's
    batched KV-cache tensors that is its own (the lowest free one, so a run is the same
    every time)."""

    def __init__(self, max_slots: int, max_tokens: int) -> None:
        if max_slots < 1 or max_tokens < 1:
            raise ValueError("a KV budget needs max_slots >= 1 and max_tokens >= 1")
        self.max_slots = max_slots
        self.max_tokens = max_tokens
        self.tokens_reserved = 0
        self._free = list(range(max_slots))  # a heap

    @property
    def slots_used(self) -> int:
        return self.max_slots - len(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def could_ever_fit(self, tokens: int) -> bool:
        return tokens <= self.max_tokens

    def fits(self, tokens: int) -> bool:
        return self.slots_used < self.max_slots and self.tokens_reserved + tokens <= self.max_tokens

    def take(self, tokens: int) -> int:
        """Reserve a slot and `tokens`; returns the slot index."""
        if not self.fits(tokens):
            raise ValueError(f"{tokens} tokens do not fit the KV budget")
        self.tokens_reserved += tokens
        return heapq.heappop(self._free)

    def give_back(self, slot: int, tokens: int) -> None:
        if not 0 <= slot < self.max_slots or slot in self._free or tokens > self.tokens_reserved:
            raise ValueError("giving back a slot or tokens that were not taken")
        self.tokens_reserved -= tokens
        heapq.heappush(self._free, slot)
