"""Tenant isolation for the batching core: a two-rate three-colour marker per tenant
class (RFC 2698, colour-blind) in front of the one shared queue.

Each class has a guaranteed share of capacity (the committed rate) and an optional
burst ceiling (the peak rate), each a token bucket in rows. A request is
- green within its class's share: queued at its own priority;
- yellow over the share but within the ceiling: queued below every green request, in
  one of YELLOW_LEVELS levels by how far its class is over its share lately (its
  recent rate over its guaranteed rate, in steps of OVER_STEP): a tenant at its share
  whose Poisson noise emptied its bucket for a moment is served before one sending
  twice its share (weighted fair queuing, in coarse steps, among the over-share);
- red beyond the ceiling: what the class says, `queue` (below every yellow tier),
  `shed` (routed unscored to the late topic) or `score_late` (the late lane).

Tiers, best first (`tier_of`): green; yellow level 1 (a class at most OVER_STEP over
its share lately: noise at its share); green of a class over its share that has lately
been *served* its share (`served`), whose guarantee is met; yellow levels 2.. ; red.
Why that third tier: the shares may add up to the whole capacity, so the green load
alone can be critical, and at a critical load someone's deadlines go. Green all in one
tier spread those misses over every class by deadline, so a steady tenant at its share
lost 2.6-4.5 % of its rows while a burster at twice its share was answered 27-41 % beyond
its share (docs/BATCHING.md, "Tenants in the simulator"). A burster whose share is
already served yields to the others' green and to their moments at their share; once
it is served less than its share its green ranks first again, so its guarantee holds
even when the others run up to OVER_STEP over theirs.

Why tiers on one queue rather than a queue per tenant: requests of every tenant stay
in the same EDF heap of their tier, so a batch still takes the tightest deadlines of
all tenants together (mixing tenants in one model call is the point), and
RequestQueue.take already serves a better priority first (pipeline/batching/queue.py).
While the green load (at most the sum of the shares) fits the capacity, green
requests never wait behind a burster's excess but for the one batch already running.
The tier is an offset on Request.priority, so the batcher's per-priority arrival
rates (PolicyContext.rate_upto) count exactly the load a tier competes with.

Pure: the clock comes in as an argument; no locks, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pipeline.batching.rate import RateEstimator
from pipeline.batching.request import Request

GREEN, YELLOW, RED = "green", "yellow", "red"
COLOURS = (GREEN, YELLOW, RED)
BEYOND_ACTIONS = ("queue", "shed", "score_late")
DEFAULT_CLASS = "default"
# Far above any priority a request carries (codecs take small ints), so a tier never
# overlaps the priority levels of the tier above it.
TIER_STEP = 1 << 20
YELLOW_LEVELS = 8
OVER_STEP = 0.25  # a yellow level per 25 % over the share
TIER_SERVED_GREEN = 2  # green of an over-share class already served its share (tier_of)
TIER_RED = YELLOW_LEVELS + 2  # red, beyond: queue
# Half-life of a class's rate estimate: long against the Poisson noise of a tenant at
# its share (hundreds of requests a second), short against a burst's length.
RATE_HALF_LIFE = 1.0


class TokenBucket:
    """rate rows/s into a bucket of depth rows, full at the start. A request larger
    than the depth conforms when the bucket is full and leaves it in debt: a request is
    never split, and a tenant sending big requests must still get its rate."""

    __slots__ = ("rate", "depth", "tokens", "last")

    def __init__(self, rate: float, depth: float) -> None:
        self.rate = rate
        self.depth = depth
        self.tokens = depth
        self.last: float | None = None

    def refill(self, now: float) -> None:
        if self.last is not None and now > self.last:
            self.tokens = min(self.depth, self.tokens + (now - self.last) * self.rate)
        if self.last is None or now > self.last:
            self.last = now

    def has(self, rows: int) -> bool:
        return self.tokens > 0 and self.tokens >= min(rows, self.depth)

    def take(self, rows: int) -> None:
        self.tokens -= rows


@dataclass(frozen=True, slots=True)
class TenantClass:
    """One class's policy. rate and ceiling in rows/s; depths in rows."""

    name: str
    rate: float
    depth: float
    ceiling: float | None = None  # None: no ceiling, nothing is red
    ceiling_depth: float = 0.0
    beyond: str = "queue"

    def __post_init__(self) -> None:
        if self.rate < 0 or self.depth < 0:
            raise ValueError(f"tenant class {self.name!r}: rate and depth must be >= 0")
        if self.ceiling is not None and self.ceiling < self.rate:
            raise ValueError(f"tenant class {self.name!r}: ceiling must be >= its guaranteed rate")
        if self.beyond not in BEYOND_ACTIONS:
            raise ValueError(f"tenant class {self.name!r}: beyond must be one of {BEYOND_ACTIONS}")


@dataclass(slots=True)
class TenantCounters:
    """Rows and requests of one class since start, for metrics and the simulator."""

    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLOURS, 0))
    requests: int = 0
    shed_rows: int = 0


class TenantGate:
    """Marks each request green, yellow or red against its class's buckets.

    classes: by name; one named `default` takes unknown tenants, else they are
        best effort (no share, no ceiling: every request yellow).
    members: tenant id -> class name; a tenant id equal to a class name is in it.
    """

    def __init__(self, classes: Mapping[str, TenantClass], members: Mapping[str, str] | None = None) -> None:
        self.classes = dict(classes)
        if DEFAULT_CLASS not in self.classes:
            self.classes[DEFAULT_CLASS] = TenantClass(DEFAULT_CLASS, 0.0, 0.0)
        self.members = dict(members or {})
        for tenant, name in self.members.items():
            if name not in self.classes:
                raise ValueError(f"tenant {tenant!r}: unknown class {name!r}")
        self._committed = {n: TokenBucket(c.rate, c.depth) for n, c in self.classes.items()}
        self._peak = {
            n: TokenBucket(c.ceiling, c.ceiling_depth) for n, c in self.classes.items() if c.ceiling is not None
        }
        self._rates = {n: RateEstimator(RATE_HALF_LIFE) for n in self.classes}
        # Rows taken into batches, per class (served): whether an over-share class's
        # guarantee is being met decides where its green rows rank.
        self._served = {n: RateEstimator(RATE_HALF_LIFE) for n in self.classes}
        self.counters = {n: TenantCounters() for n in self.classes}

    def class_of(self, tenant: str | None) -> str:
        """The class of a tenant id: low cardinality, safe as a metric label."""
        if tenant is None:
            return DEFAULT_CLASS
        name = self.members.get(tenant, tenant)
        return name if name in self.classes else DEFAULT_CLASS

    def mark(self, req: Request, now: float) -> str:
        """Colour req, set its tenant_class and lower its priority by its tier; the
        caller acts on red per beyond(req)."""
        name = req.tenant_class = self.class_of(req.tenant)
        self._rates[name].observe(now, req.rows)
        committed, peak = self._committed[name], self._peak.get(name)
        committed.refill(now)
        if peak is not None:
            peak.refill(now)
        if peak is not None and not peak.has(req.rows):
            colour = RED
        elif committed.has(req.rows):
            colour = GREEN
            committed.take(req.rows)
        else:
            colour = YELLOW
        if peak is not None and colour != RED:
            peak.take(req.rows)
        c = self.counters[name]
        c.rows[colour] += req.rows
        c.requests += 1
        req.priority += TIER_STEP * self.tier_of(name, colour, now)
        return colour

    def tier_of(self, name: str, colour: str, now: float) -> int:
        """0 green; 1 yellow at most OVER_STEP over the share lately; 2 green of a class
        over its share and lately served at least it; 3.. yellow further over; red last."""
        if colour == RED:
            return TIER_RED
        if colour == YELLOW:
            level = self._over_level(name, now)
            return level if level == 1 else level + 1
        used, served = self.share_used(name, now), self.served_share(name, now)
        if used is not None and served is not None and used > 1.0 + OVER_STEP and served >= 1.0:
            return TIER_SERVED_GREEN
        return 0

    def _over_level(self, name: str, now: float) -> int:
        """1 (at most OVER_STEP over the share lately) .. YELLOW_LEVELS (far over, or no share)."""
        used = self.share_used(name, now)
        if used is None:
            return YELLOW_LEVELS
        return 1 + min(YELLOW_LEVELS - 1, max(0, math.ceil((used - 1.0) / OVER_STEP) - 1))

    def _of_share(self, estimates: dict[str, RateEstimator], name: str, now: float) -> float | None:
        """A recent rate of a class over its guaranteed rate; None without a share."""
        rate = self.classes[name].rate
        return estimates[name].rate(now) / rate if rate > 0 else None

    def share_used(self, name: str, now: float) -> float | None:
        """A class's recent rate over its guaranteed rate; None without a share."""
        return self._of_share(self._rates, name, now)

    def over_share(self, tenant: str | None, now: float) -> bool:
        """Whether a tenant's class has lately sent more than OVER_STEP over its share
        (or has none): its records are the ones admission routes late first when a
        poll's oldest must go before decoding (pipeline/worker/admission.py). Lately:
        the rows that reached the gate, so a class whose excess admission sheds reads
        lower here and keeps about 1 + OVER_STEP of its share; a tenant at its share
        whose Poisson noise empties its bucket for a moment is not over."""
        used = self.share_used(self.class_of(tenant), now)
        return used is None or used > 1.0 + OVER_STEP

    def served(self, reqs: Iterable[Request], now: float) -> None:
        """Requests just taken into a batch for the model (not the late lane's: rows
        scored past their deadline are no service a guarantee counts)."""
        for r in reqs:
            self._served[r.tenant_class or DEFAULT_CLASS].observe(now, r.rows)

    def served_share(self, name: str, now: float) -> float | None:
        """A class's recent rows served over its guaranteed rate; None without a share."""
        return self._of_share(self._served, name, now)

    def beyond(self, req: Request) -> str:
        return self.classes[req.tenant_class or DEFAULT_CLASS].beyond

    def shed(self, req: Request) -> None:
        self.counters[req.tenant_class or DEFAULT_CLASS].shed_rows += req.rows


def base_priority(priority: int) -> int:
    """A request's priority before its tier offset."""
    return priority % TIER_STEP
