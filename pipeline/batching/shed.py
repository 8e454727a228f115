"""Which polled records to route late before decoding them: those that cannot reach
the batch queue with enough of their budget left to be answered in time.

Why (issue 26, docs/BATCHING.md "Bursts in the real pipeline"): in the real worker the
bottleneck of a CTR burst is the source thread (decoding JSON, ~76 µs a request), not
the model, so the backlog of a burst forms in Kafka and in librdkafka's prefetch queue,
first in first out, where no policy sees it. Routing only records already past their
deadline (the rule before this module) lets that backlog settle at an age of one whole
budget: every record then reaches the queue with no slack left, is scored late or
dropped as hopeless after its decode was paid for, and goodput in a 150 % burst fell to
0.01-0.05 x capacity for every policy. Shedding at a horizon short of the budget
instead makes the backlog settle at that horizon, and the records decoded have the rest
of the budget for the queue, the model and the publisher.

Pure: ages and decode times come in as arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

# Share of the loosest budget a record must still have when it reaches the queue:
# for the queue, the model and the publisher thread. In a burst on Apache Kafka with the
# CTR pipeline on two busy cores, the queue and model stages of tidebatch_stage_seconds
# took p50 7 + 11 ms and p99 31 + 144 ms of a 100 ms SLO (docs/BATCHING.md, "Bursts in
# the real pipeline"); not learned online, as admission never sees them.
DEFAULT_RESERVE = 0.5


class DecodeCost:
    """Milliseconds of source-thread work per record (decode and deadlines), learned
    from whole polls: decayed sums of time and records, so a poll of 1000 records
    weighs more than a poll of one, and whole-millisecond clock readings average out."""

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError("decay must be in (0, 1)")
        self.decay = decay
        self._ms = 0.0
        self._records = 0.0

    def observe(self, records: int, ms: float) -> None:
        if records <= 0:
            return
        self._ms = self._ms * self.decay + max(ms, 0.0)
        self._records = self._records * self.decay + records

    @property
    def per_record_ms(self) -> float:
        """0 until a poll was observed: then nothing is predicted, only expiry counts."""
        return self._ms / self._records if self._records else 0.0


class AnswerTime:
    """Milliseconds from a request's decode to its answer (its result handed to the
    producer, whose send time is the result's timestamp), as a decayed peak over batches: each
    batch's slowest request raises it at once, and it sinks back towards the recent
    batches' slowest by `decay` a batch. The reserve a record must still have when it
    reaches the queue (`reserve_ms`), learned instead of assumed: at 50 % load on a
    busy machine a fixed half budget routed records 50-100 ms old that would have made
    it (273 routed against 28 under the expired-only rule; issue 26)."""

    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError("decay must be in (0, 1)")
        self.decay = decay
        self._ms: float | None = None

    def observe(self, ms: Sequence[float]) -> None:
        if not ms:
            return
        worst = max(ms)
        if self._ms is None or worst >= self._ms:
            self._ms = worst
        else:
            self._ms = self._ms * self.decay + worst * (1.0 - self.decay)

    @property
    def ms(self) -> float | None:
        """None until a batch was answered."""
        return self._ms


def reserve_ms(budget_ms: float, reserve: float, answer_ms: float | None) -> float:
    """What of the budget a record must still have when it reaches the queue: the
    learned answer time, at most `reserve` of the budget (the cap, and the figure
    before anything was answered); 0 with `reserve` 0, the expired-only rule."""
    cap = budget_ms * reserve
    return cap if answer_ms is None else min(cap, answer_ms)


def shed_count(ages_ms: Sequence[float], per_record_ms: float, horizon_ms: float) -> int:
    """How many of a poll's records, oldest first (`ages_ms` sorted descending), to
    route late: the oldest ones, until the rest all reach the queue — after the decode
    of every kept record of the poll, which are queued together — by `horizon_ms` of
    age. Shedding the oldest first also serves the newest-feasible first, as the
    batcher's hopeless rule does inside the queue (pipeline/batching/policies.py)."""
    return shed_prefix([horizon_ms - age for age in ages_ms], per_record_ms)


def shed_prefix(slack_ms: Sequence[float], per_record_ms: float) -> int:
    """How many records to route late from the front of a poll listed in shed order
    (the first goes first): the fewest such that every kept record reaches the queue,
    after the decode of all the kept ones, within its slack (its horizon minus its
    age). With one horizon and the oldest first this is shed_count; with tenant
    classes the records of classes over their share come first, with a shorter
    horizon (pipeline/worker/admission.py), so a burster's backlog is shed before a
    steady tenant's record of the same age."""
    n = len(slack_ms)
    tightest = [0.0] * n  # tightest[i]: the least slack among records i..n-1
    least = float("inf")
    for i in range(n - 1, -1, -1):
        least = min(least, slack_ms[i])
        tightest[i] = least
    for i in range(n):
        # Kept: records i..n-1, all decoded before any is queued.
        if (n - i) * per_record_ms <= tightest[i]:
            return i
    return n
