"""The KV-cache memory budget of one decoder: a slot count (sequences held at once)
and a token budget (prompt + generated tokens of every active sequence). Pure."""

from __future__ import annotations


class KvBudget:
    """Admission reserves a sequence's whole growth, prompt + max_new_tokens, so the
    tokens actually held never pass `max_tokens` however long each sequence runs.
    vLLM reserves less and preempts (swaps or recomputes a sequence) when memory runs
    out; without preemption a reservation is the only way to never run out mid-step."""

    def __init__(self, max_slots: int, max_tokens: int) -> None:
        if max_slots < 1 or max_tokens < 1:
            raise ValueError("a KV budget needs max_slots >= 1 and max_tokens >= 1")
        self.max_slots = max_slots
        self.max_tokens = max_tokens
        self.slots_used = 0
        self.tokens_reserved = 0

    @property
    def free_slots(self) -> int:
        return self.max_slots - self.slots_used

    def could_ever_fit(self, tokens: int) -> bool:
        return tokens <= self.max_tokens

    def fits(self, tokens: int) -> bool:
        return self.slots_used < self.max_slots and self.tokens_reserved + tokens <= self.max_tokens

    def take(self, tokens: int) -> None:
        if not self.fits(tokens):
            raise ValueError(f"{tokens} tokens do not fit the KV budget")
        self.slots_used += 1
        self.tokens_reserved += tokens

    def give_back(self, tokens: int) -> None:
        if self.slots_used < 1 or tokens > self.tokens_reserved:
            raise ValueError("giving back more than was taken")
        self.slots_used -= 1
        self.tokens_reserved -= tokens
