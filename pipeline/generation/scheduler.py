"""The generation scheduler: which sequences to prefill and which to step, decided
once per decoding step. Pure (the clock is passed in, no I/O, no model), so the same
code runs under a real decoder, in the simulator (pipeline/generation/simulate.py) and
in unit tests, as the batching core does (pipeline/batching/batcher.py).

The caller's loop, whatever runs the model:

    plan = scheduler.plan(now)            # expiries, admissions, this step's work
    ...run plan.prefill chunks and plan.decode sequences through the model...
    done = scheduler.complete(plan, now, stopped)   # ids that emitted stop/EOS

Every sequence in `plan.emitting` produced one token in the step: a decoded sequence
its next token, a prefilled one whose prompt is now whole its first token (the prefill
step's last logits). Finished sequences retire inside `complete`, so their slot and KV
tokens are free for the next `plan`.

Waiting requests sit in the batching core's RequestQueue (pipeline/batching/queue.py)
in EDF order within strict priority, one row per request. Admission takes the queue's
head while the policy and the KV budget allow, and stops at the first head that does
not fit: skipping it for smaller requests behind would starve long prompts and break
the priority order.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from pipeline.batching.queue import RequestQueue
from pipeline.batching.request import Request
from pipeline.generation.budget import KvBudget
from pipeline.generation.policies import GenerationPolicy
from pipeline.generation.sequence import (
    CANCELLED,
    EXPIRED,
    FINISH_LENGTH,
    FINISH_STOP,
    REFUSED,
    GenRequest,
    Outcome,
    Sequence,
)

_BUCKET = 0  # one shape for every request: a decoder's KV slots take any length


@dataclass(slots=True, frozen=True)
class PrefillChunk:
    sequence: Sequence
    start: int  # first prompt token of the chunk
    tokens: int

    @property
    def completes_prompt(self) -> bool:
        return self.start + self.tokens >= self.sequence.request.prompt_tokens


@dataclass(slots=True)
class Plan:
    """One decoding step's work, plus the requests that expired while it was planned."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Sequence] = field(default_factory=list)
    expired: list[Outcome] = field(default_factory=list)
    at: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def emitting(self) -> list[Sequence]:
        """The sequences that produce a token in this step."""
        return [c.sequence for c in self.prefill if c.completes_prompt] + self.decode

    @property
    def prefill_tokens(self) -> int:
        return sum(c.tokens for c in self.prefill)

    @property
    def context_tokens(self) -> int:
        """KV tokens the decoded sequences attend to in this step."""
        return sum(s.context_tokens for s in self.decode)


class GenerationScheduler:
    def __init__(self, policy: GenerationPolicy, budget: KvBudget, *, prefill_chunk: int | None = None) -> None:
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError("prefill_chunk must be >= 1 token (or None: whole prompts)")
        self.policy = policy
        self.budget = budget
        # Prompt tokens prefilled per step, all sequences together (chunked prefill, as
        # Sarathi-Serve): a long prompt no longer stalls every running sequence's next
        # token for its whole prefill. None: each prompt whole in its admission step.
        self.prefill_chunk = prefill_chunk
        self.queue = RequestQueue("edf")
        self.active: list[Sequence] = []  # admission order
        self._in_flight: Plan | None = None

    # -- state -----------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def has_work(self) -> bool:
        return bool(self.active) or len(self.queue) > 0

    @property
    def tokens_in_use(self) -> int:
        """KV tokens the active sequences hold now (never above the reservation)."""
        return sum(s.context_tokens for s in self.active)

    # -- requests in ----------------------------------------------------------------
    def submit(self, req: GenRequest) -> Outcome | None:
        """Queue a request, or refuse it at once (its outcome) if it could never run."""
        why = ""
        if req.prompt_tokens < 1:
            why = "empty prompt"
        elif req.max_new_tokens < 1:
            why = "max_new_tokens must be >= 1"
        elif not self.budget.could_ever_fit(req.reserve_tokens):
            why = (f"prompt + max_new_tokens is {req.reserve_tokens} tokens, over the KV "
                   f"budget of {self.budget.max_tokens}")
        if why:
            return Outcome(req, REFUSED, req.arrival, detail=why)
        self.queue.push(Request(1, req.arrival, req.deadline, req.priority, _BUCKET, req))
        return None

    # -- one step ---------------------------------------------------------------------
    def plan(self, now: float) -> Plan:
        """Expire, admit, and say what the next step runs. One plan at a time: the
        caller reports it with complete() before asking for the next."""
        if self._in_flight is not None:
            raise RuntimeError("the previous plan has not been completed")
        plan = Plan(expired=self._expire(now), at=now)
        self._admit(now)
        room = self.prefill_chunk
        for seq in self.active:
            if seq.prefilling:
                if room == 0:
                    continue
                left = seq.request.prompt_tokens - seq.prefilled
                take = left if room is None else min(left, room)
                plan.prefill.append(PrefillChunk(seq, seq.prefilled, take))
                room = None if room is None else room - take
            else:
                plan.decode.append(seq)
        if not plan.empty:
            self._in_flight = plan
        return plan

    def complete(self, plan: Plan, now: float, stopped: Collection[str] = ()) -> list[Outcome]:
        """Report a step: every sequence in plan.emitting produced one token, those
        whose id is in `stopped` their stop/EOS token. Returns the finished outcomes;
        their slots and tokens are free when this returns."""
        if plan is not self._in_flight:
            raise RuntimeError("complete() takes the plan the last plan() returned")
        self._in_flight = None
        emitting = plan.emitting
        unknown = set(stopped) - {s.request_id for s in emitting}
        if unknown:
            raise ValueError(f"stopped ids that emitted no token in this step: {sorted(unknown)}")
        for chunk in plan.prefill:
            chunk.sequence.prefilled += chunk.tokens
        done: list[Outcome] = []
        for seq in emitting:
            seq.generated += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
            if seq.request_id in stopped:
                done.append(self._retire(seq, FINISH_STOP, now))
            elif seq.generated >= seq.request.max_new_tokens:
                done.append(self._retire(seq, FINISH_LENGTH, now))
        return done

    def cancel(self, request_ids: Collection[str], now: float) -> list[Outcome]:
        """Take these requests out, waiting or running (a revoked partition's requests,
        pipeline/generation/service.py): their slots and tokens are free at once. Not
        while a plan is in flight: its tokens are still to be reported."""
        if self._in_flight is not None:
            raise RuntimeError("cancel() between complete() and the next plan()")
        gone = set(request_ids)
        out = [self._retire(s, CANCELLED, now) for s in list(self.active) if s.request_id in gone]
        for r in self.queue.drain():
            if r.item.request_id in gone:
                out.append(Outcome(r.item, CANCELLED, now, detail="cancelled while waiting"))
            else:
                self.queue.push(r)
        return out

    # -- internals --------------------------------------------------------------------
    def _expire(self, now: float) -> list[Outcome]:
        # EDF: the top of each priority heap has the earliest deadline, so pop_while
        # takes exactly the expired requests.
        gone = self.queue.pop_while(_BUCKET, lambda r: r.deadline <= now)
        return [Outcome(r.item, EXPIRED, now, detail="deadline passed before admission") for r in gone]

    def _admit(self, now: float) -> None:
        budget = self.budget
        for _ in range(self.policy.admits(len(self.active), budget.free_slots)):
            head = self.queue.head(_BUCKET)
            if head is None or not budget.fits(head.item.reserve_tokens):
                return
            self.queue.pop_head(_BUCKET)
            slot = budget.take(head.item.reserve_tokens)
            self.active.append(Sequence(head.item, now, slot))

    def _retire(self, seq: Sequence, reason: str, now: float) -> Outcome:
        self.active.remove(seq)
        self.budget.give_back(seq.slot, seq.request.reserve_tokens)
        return Outcome(seq.request, reason, now, seq.generated, seq.first_token_at)
