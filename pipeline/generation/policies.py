"""The three generation batching policies behind one question: how many waiting
requests may be admitted now? (The KV budget and the queue's EDF-within-priority order,
pipeline/generation/scheduler.py, decide which ones.) Pure."""

from __future__ import annotations


class GenerationPolicy:
    name = "base"

    def admits(self, active: int, free_slots: int) -> int:
        """How many requests may be admitted, with `active` sequences running and
        `free_slots` slots free in the KV budget."""
        raise NotImplementedError


class NoBatching(GenerationPolicy):
    """One sequence at a time: the baseline without batching."""

    name = "none"

    def admits(self, active: int, free_slots: int) -> int:
        return 1 if active == 0 and free_slots > 0 else 0


class StaticBatching(GenerationPolicy):
    """Request-level batching: a batch is admitted only when the last one has wholly
    finished, so it runs as long as its longest member; the slots of members that
    finished early stay idle and newcomers wait (the failure Orca, OSDI '22, fixes).
    Work-conserving: the batch starts with whatever is waiting, without a linger."""

    name = "static"

    def admits(self, active: int, free_slots: int) -> int:
        return free_slots if active == 0 else 0


class ContinuousBatching(GenerationPolicy):
    """Iteration-level batching (Orca, vLLM): every step may admit into any free slot."""

    name = "continuous"

    def admits(self, active: int, free_slots: int) -> int:
        return free_slots


POLICIES: dict[str, type[GenerationPolicy]] = {
    p.name: p for p in (NoBatching, StaticBatching, ContinuousBatching)
}


def make_generation_policy(name: str) -> GenerationPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown generation policy {name!r}; use {', '.join(POLICIES)}") from None
