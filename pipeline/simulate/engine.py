"""The simulator's engine: one discrete-event run of the batching core.

It replays the very same Batcher and policy code the worker runs, on a FakeClock,
against an arrival trace and a latency curve t(n) = a + b·n, so policies can be
compared on curves this machine does not have (GPU-like ones) in a fraction of the
simulated time, deterministically.

Model of one worker:

  producers ──► Kafka backlog (unbounded FIFO) ──► bounded in-time queue ──► k executors
                     ▲ paused while the queue is above its high watermark (rows),
                       resumed below the low one — the worker's backpressure.

- Each request's deadline is its produce time plus the SLO budget of its priority
  (a per-request deadline in a trace may only tighten it).
- An executor runs a batch in t(padded rows) × noise, noise lognormal with mean 1.
- The cost model starts from the true curve (as the worker's warm-up profile would)
  and then learns online from the noisy service times, like the worker.
- Every request gets exactly one outcome: scored in time, scored late (after its
  deadline), or routed late (published unscored to the late topic). Latency is from
  produce to that outcome.
- Produce is arrival unless the Kafka hop is modelled (`hop_ms`, `--hop-ms`): then each
  request reaches the worker a lognormal delay after it was produced, and its deadline,
  age and latency still count from its produce time, as the worker's count from the
  record's Kafka timestamp (docs/OPERATIONS.md, "Where the time goes": `to_worker`).
- Load is relative to the curve's capacity: max_batch_rows / t(max_batch_rows) rows/s.
- Decoding is free unless SimConfig.decode_s (`--decode-us`) says what a request costs
  the source thread. Then a single source takes up to `poll_records` from the backlog at
  a time and queues them together once all are decoded, as the worker does, and with
  adaptive + route_late it routes late undecoded the records the worker would
  (pipeline/batching/shed.py, pipeline/worker/admission.py): on the reserve while a
  backlog stands (StandingBacklog), else only the expired. In the real CTR pipeline
  the source thread, not the model, is what a burst saturates (docs/BATCHING.md).
- A request is answered when the model ends unless SimConfig.publish_s (`--publish-us`)
  says what handing its result over costs: then a publisher, separate from the
  executors, hands a batch's results over one after another once the model is done
  (and once it has finished the batches before), and the batcher gets each deadline
  less the answer tail it learns from that, as the worker's admission does
  (pipeline/batching/tail.py).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass

from pipeline.batching.batcher import Batcher
from pipeline.batching.cost import AffineCost, CostModel
from pipeline.batching.registry import make_policy
from pipeline.batching.request import Batch, Request
from pipeline.batching.shed import (
    DEFAULT_RESERVE,
    AnswerTime,
    StandingBacklog,
    keep_one_to_learn,
    reserve_ms,
    shed_count,
)
from pipeline.batching.tail import AnswerTail
from pipeline.batching.tenants import TenantClass, TenantGate
from pipeline.clock import FakeClock
from pipeline.simulate.curves import Curve
from pipeline.simulate.results import IN_TIME, LATE, ROUTED, RunRecord, RunResult, measure
from pipeline.simulate.specs import PolicySpec, policy_spec
from pipeline.simulate.workload import Workload


@dataclass
class SimConfig:
    executors: int = 1
    noise: float = 0.1  # sigma of the lognormal multiplicative noise on service times
    seed: int = 1
    high_watermark: int = 20_000  # rows, the worker's default (batching.queue_high_rows)
    low_watermark: int | None = None  # default half the high watermark
    # Tenant classes by name (batching/tenants.py): a fresh TenantGate per run; None:
    # one shared queue, as the worker without a `tenants:` section.
    tenants: dict[str, TenantClass] | None = None
    decode_s: float = 0.0  # source-thread seconds per request; 0: admission is free
    poll_records: int = 1000  # records per poll, the worker's
    shed_reserve: float = DEFAULT_RESERVE  # Admission's reserve (route_late only)
    # Per-tenant SLA, seconds by tenant name (pipeline/simulate/tenants.py): a request's
    # budget, whatever its priority, as a `tenants:` class's slo_ms gives it in the
    # worker (pipeline/config/tenants.py); absent tenants get the curve's budget.
    tenant_slo: dict[str, float] | None = None
    publish_s: float = 0.0  # publisher-thread seconds per result; 0: answered at the model's end


class _Sim:
    """One run: the event loop and its bookkeeping."""

    def __init__(self, workload: Workload, curve: Curve, spec: PolicySpec, cfg: SimConfig) -> None:
        self.w, self.curve, self.spec, self.cfg = workload, curve, spec, cfg
        policy = make_policy(spec.policy, **spec.params)
        cost = CostModel(prior=AffineCost(curve.a, curve.b))
        gate = TenantGate(cfg.tenants) if cfg.tenants else None
        self.batcher = Batcher(policy, cost, **spec.batcher, tenants=gate)
        self.clock = FakeClock()
        n = len(workload.arrivals)
        self.deadline = [0.0] * n
        self.finish = [math.inf] * n
        self.outcome = bytearray(n)
        self.backlog: deque[int] = deque()
        self.paused = False
        self.high = cfg.high_watermark
        self.low = cfg.high_watermark // 2 if cfg.low_watermark is None else cfg.low_watermark
        self.free = cfg.executors
        self.events: list[tuple[float, int, Batch | None, float]] = []
        self.seq = 0
        self.timer: float | None = None
        self.noise_rng = random.Random(cfg.seed + 31337)
        self.busy = 0.0
        self.batches = 0
        self.batch_rows = 0
        self.pauses = 0
        self.mixed = 0  # batches with requests of more than one tenant
        # The source thread (cfg.decode_s > 0): the poll being decoded and when it is done.
        self.decoding: list[int] = []
        self.decoded_at = math.inf
        # Admission sheds before decoding for a policy with a late lane that routes, as
        # the worker's does (pipeline/worker/core.py).
        self.sheds = policy.separates_late and spec.batcher.get("expiry_action", "route_late") == "route_late"
        self.answer_time = AnswerTime()  # decode to answer, as the worker's admission learns it
        self.standing = StandingBacklog()  # whether a backlog stands, as admission's
        self.loosest = max(curve.slo.values())
        self.publisher_free = 0.0  # when the publisher has handed over every result so far (publish_s)
        self.tail = AnswerTail()  # model end to a batch's last result, as the worker's admission learns it

    # -- requests in and out ----------------------------------------------------
    def _admit(self, i: int, now: float) -> None:
        a = self.w.arrivals[i]
        deadline = self.deadline[i]
        if self.cfg.publish_s > 0:  # the model must be done before the answer tail
            deadline -= self.tail.for_budget((deadline - a.origin) * 1000.0) / 1000.0
        self.batcher.add(Request(a.rows, now, deadline, a.priority, 0, i, tenant=a.tenant, due=self.deadline[i]), now)
        self._collect_routed(now)
        if not self.paused and self.batcher.backpressure_rows >= self.high:
            self.paused = True
            self.pauses += 1

    def _collect_routed(self, now: float) -> None:
        if not self.batcher.routed_pending:
            return
        for req in self.batcher.pop_routed_late():
            self.finish[req.item] = now
            self.outcome[req.item] = ROUTED

    def _complete(self, batch: Batch, service: float, now: float) -> None:
        self.free += 1
        self.batcher.observe(batch, service)
        answered = [now] * len(batch.requests)
        if self.cfg.publish_s > 0:
            start = max(now, self.publisher_free)
            answered = [start + (k + 1) * self.cfg.publish_s for k in range(len(batch.requests))]
            self.publisher_free = answered[-1] if answered else start
            self.tail.observe((self.publisher_free - now) * 1000.0)
        if self.sheds:
            self.answer_time.observe([(t - req.arrival) * 1000.0 for t, req in zip(answered, batch.requests, strict=True)])
        for t, req in zip(answered, batch.requests, strict=True):
            i = req.item
            self.finish[i] = t
            self.outcome[i] = IN_TIME if t <= self.deadline[i] else LATE

    # -- dispatch ------------------------------------------------------------------
    def _dispatch(self, now: float) -> None:
        while self.free > 0 and len(self.batcher):
            batch = self.batcher.next_batch(now)
            self._collect_routed(now)
            if batch is None:
                wake = self.batcher.next_wakeup()
                if wake is not None and wake != self.timer:
                    self.timer = max(wake, math.nextafter(now, math.inf))
                    self._push(self.timer, None, 0.0)
                return
            self.free -= 1
            rows = batch.pad_to_rows or batch.rows
            service = self.curve.service(rows)
            if self.cfg.noise > 0:
                s = self.cfg.noise
                service *= self.noise_rng.lognormvariate(-s * s / 2, s)
            self.busy += service
            self.batches += 1
            self.batch_rows += batch.rows
            self.mixed += len({r.tenant for r in batch.requests}) > 1
            self._push(now + service, batch, service)

    def _push(self, t: float, batch: Batch | None, service: float) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, batch, service))

    def _pump(self, now: float) -> None:
        """Dispatch, then resume the consumer if the queue fell below the low watermark
        (pulling the backlog may enable more dispatches)."""
        while True:
            self._dispatch(now)
            if not (self.paused and self.batcher.backpressure_rows <= self.low):
                return
            self.paused = False
            if self.cfg.decode_s > 0:
                self._poll(now)
                return
            while self.backlog and not self.paused:
                self._admit(self.backlog.popleft(), now)

    # -- the source thread (cfg.decode_s > 0) ------------------------------------------
    def _poll(self, now: float) -> None:
        """Take the next poll from the backlog if the source is free: route late what
        admission would (pipeline/worker/admission.py), decode the rest."""
        if self.decoding or self.paused or not self.backlog:
            return
        poll = [self.backlog.popleft() for _ in range(min(self.cfg.poll_records, len(self.backlog)))]
        if self.sheds:
            ages_ms = [(now - self.w.arrivals[i].origin) * 1000.0 for i in poll]  # FIFO: oldest first
            budget_ms = self.loosest * 1000.0
            shed = expired = sum(1 for age in ages_ms if age > budget_ms)
            # On the reserve only while a backlog stands (pipeline/worker/admission.py).
            if self.standing.poll(now * 1000.0, max(ages_ms), budget_ms):
                horizon_ms = budget_ms - reserve_ms(budget_ms, self.cfg.shed_reserve, self.answer_time.ms)
                on_reserve = shed_count(ages_ms, self.cfg.decode_s * 1000.0, horizon_ms) - expired
                shed += keep_one_to_learn(on_reserve, len(poll) - expired, self.answer_time.ms is not None)
            for i in poll[:shed]:
                self.finish[i] = now
                self.outcome[i] = ROUTED
            poll = poll[shed:]
        if poll:
            self.decoding = poll
            self.decoded_at = now + len(poll) * self.cfg.decode_s

    def _decoded(self, now: float) -> None:
        poll, self.decoding, self.decoded_at = self.decoding, [], math.inf
        for i in poll:
            self._admit(i, now)
        self._poll(now)

    # -- the loop --------------------------------------------------------------------
    def run(self) -> None:
        arrivals = self.w.arrivals
        curve = self.curve
        n = len(arrivals)
        i = 0
        events = self.events
        while i < n or events or self.decoding:
            t_arr = arrivals[i].t if i < n else math.inf
            if self.decoded_at <= t_arr and (not events or self.decoded_at <= events[0][0]):
                now = self.decoded_at
                self.clock.set(now)
                self._decoded(now)
            elif events and events[0][0] <= t_arr:
                now, _, batch, service = heapq.heappop(events)
                self.clock.set(now)
                if batch is not None:
                    self._complete(batch, service, now)
                elif now == self.timer:
                    self.timer = None
            else:
                now = t_arr
                self.clock.set(now)
                a = arrivals[i]
                slo = self.cfg.tenant_slo
                budget = a.origin + (slo[a.tenant] if slo and a.tenant in slo else curve.budget(a.priority))
                self.deadline[i] = budget if a.deadline is None else min(budget, a.deadline)
                if self.cfg.decode_s > 0:
                    self.backlog.append(i)
                    self._poll(now)
                elif self.paused or self.backlog:
                    self.backlog.append(i)
                else:
                    self._admit(i, now)
                i += 1
            self._pump(now)
            if not events and i >= n and not self.decoding and (len(self.batcher) or self.backlog):
                # Nothing left to wake the loop: flush (cannot happen with the shipped
                # policies; a guard against a policy that waits forever).
                for b in self.batcher.drain(now):
                    self.free -= 1
                    self._push(now + curve.service(b.pad_to_rows or b.rows), b, 0.0)
                while self.backlog:
                    self._admit(self.backlog.popleft(), now)
        self._collect_routed(self.clock.now())

    def record(self) -> RunRecord:  # what the run leaves for measure()
        return RunRecord(self.w, self.curve, self.spec.label, self.spec.describe(), self.cfg.executors,
                         self.finish, self.outcome, self.busy, self.batches, self.batch_rows, self.pauses, self.mixed)


def simulate(
    workload: Workload,
    curve: Curve,
    policy: str | PolicySpec,
    cfg: SimConfig | None = None,
    tuned: tuple[int, float] | None = None,
) -> RunResult:
    """Run one policy over one workload and measure it."""
    spec = policy if isinstance(policy, PolicySpec) else policy_spec(policy, curve, tuned)
    sim = _Sim(workload, curve, spec, cfg or SimConfig())
    sim.run()
    return measure(sim.record())

