"""What the generation scheduler holds: a request as it arrives (`GenRequest`), a
sequence while it holds a slot (`Sequence`), and the one `Outcome` every request ends
with. Pure data: no clock, no I/O, no model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Why a request ended; the finish reasons match the final record issue 25 asks for.
FINISH_STOP = "stop"  # the caller reported a stop/EOS token
FINISH_LENGTH = "length"  # max_new_tokens generated
EXPIRED = "expired"  # its deadline passed before it was admitted
REFUSED = "refused"  # it could never run (empty prompt, 0 tokens, over the KV budget)
CANCELLED = "cancelled"  # taken out by the caller (its partition was revoked)


@dataclass(slots=True, eq=False)
class GenRequest:
    """One generation request. Times are on the scheduler's caller's clock (seconds).
    The deadline is an admission deadline: a request not admitted by then expires
    (one that is running is never cut short: its KV cache is already paid for)."""

    request_id: str
    prompt_tokens: int
    max_new_tokens: int
    arrival: float
    deadline: float
    priority: int = 0  # lower number = admitted first, as in pipeline/batching/request.py
    item: Any = None  # opaque to the scheduler: what the caller's decoder needs

    @property
    def reserve_tokens(self) -> int:
        """KV-cache tokens the sequence can grow to: what admission reserves."""
        return self.prompt_tokens + self.max_new_tokens


@dataclass(slots=True, eq=False)
class Sequence:
    """An admitted request: its slot, how much of its prompt is in the KV cache, how
    many tokens it has generated."""

    request: GenRequest
    admitted_at: float
    slot: int  # its row in the decoder's KV cache (pipeline/generation/budget.py)
    prefilled: int = 0
    generated: int = 0
    first_token_at: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.request.prompt_tokens

    @property
    def context_tokens(self) -> int:
        """Tokens in its KV cache: what its next decoding step attends to."""
        return self.prefilled + self.generated


@dataclass(slots=True, frozen=True)
class Outcome:
    """The one final outcome of a request."""

    request: GenRequest
    reason: str
    at: float
    generated: int = 0
    first_token_at: float | None = None
    detail: str = ""

    @property
    def finished(self) -> bool:
        return self.reason in (FINISH_STOP, FINISH_LENGTH)

    @property
    def ttft(self) -> float | None:
        """Time to first token, from arrival (None when no token was generated)."""
        return None if self.first_token_at is None else self.first_token_at - self.request.arrival

    @property
    def latency(self) -> float:
        return self.at - self.request.arrival
