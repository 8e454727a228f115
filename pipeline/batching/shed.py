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

import math
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


def keep_one_to_learn(shed: int, poll: int, answered: bool) -> int:
    """How many of a poll's `shed` records to shed after all: one fewer when the reserve
    would take the whole poll before anything was answered. With every record shed
    nothing is ever answered and the reserve never learns: a hop longer than the cap (a
    distant producer, a slow broker) routed every request late, for good."""
    return shed - 1 if not answered and poll and shed >= poll else shed


# A backlog stands when the oldest record of every poll over STANDING_WINDOW of the
# budget was at least STANDING_AGE of it old: CoDel's test (RFC 8289), the least delay
# over an interval against a target, taken per poll since a poll takes what waited as a
# whole (its youngest record, fetched last, waited nothing). At 50 % load polls of a few
# records come every few ms, some of them fresh; in a burst each poll holds what
# arrived while the last one was decoded, its oldest tens of ms old. In the simulator (a
# 50 ms hop tail, the worker's curve and source cost) this window and target kept the
# burst's goodput as shedding on every poll did (tests/unit/test_simulate_decode.py);
# a whole budget's window, or a fifth of it as the target, cost it 5-10 %.
STANDING_AGE = 0.1
STANDING_WINDOW = 0.5


class StandingBacklog:
    """Whether a backlog stands in front of admission: every poll's oldest record has
    been at least STANDING_AGE of the budget old for STANDING_WINDOW of it. Shedding on
    the reserve buys decode time for a backlog that stands; a hiccup of the hop or of
    the machine ages a few polls' records while fresh ones keep arriving between them. At 50 % load on
    Apache Kafka the reserve (a decayed peak: a worst case) routed 10-145 such records a
    run, in 3 of 10 runs, where greedy, which sheds nothing, answered all in time
    (docs/BATCHING.md, "Which rule routed them")."""

    def __init__(self) -> None:
        # Standing from the start: a worker's first polls hold what waited for it, a
        # backlog by definition; the first fresh poll says otherwise.
        self._old_since: float | None = -math.inf

    def poll(self, now_ms: float, oldest_ms: float | None, budget_ms: float) -> bool:
        """Note a poll whose oldest record is `oldest_ms` old (None: none had a
        timestamp, which changes nothing) and say whether a backlog stands, for
        requests of this (loosest) budget."""
        if oldest_ms is not None:
            if oldest_ms < budget_ms * STANDING_AGE:
                self._old_since = None
            elif self._old_since is None:
                self._old_since = now_ms
        return self._old_since is not None and now_ms - self._old_since >= budget_ms * STANDING_WINDOW


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
