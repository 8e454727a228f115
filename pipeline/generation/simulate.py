"""The generation simulator: the very same GenerationScheduler a decoder will drive
(pipeline/generation/scheduler.py), stepped on simulated time against Poisson
arrivals and a per-step cost curve (pipeline/generation/cost.py), so none / static /
continuous batching can be compared beyond this machine. Deterministic for a seed.

One decoder, one step at a time: each step costs t(plan) × lognormal noise (σ, mean
1); requests that arrive during a step are queued before the next plan. Each request
draws a prompt length and an output length; it emits its stop token when it has
generated that many (or finishes at max_new_tokens). Every request ends with exactly
one outcome: finished (stop or length), expired (not admitted by its deadline: arrival
+ the curve's slo_ms for its priority) or refused (could never fit the KV budget).

Figures: generated tokens/s counts the tokens emitted by steps that ended within the
arrival window [0, duration); TTFT (arrival → first token) and latency (arrival →
last token) are over finished requests, expired ones counted beside them; inter-token
latency (ITL) is the gap between consecutive tokens of a sequence, over all tokens.
Load is relative to StepCost.capacity_req_s, the rate continuous batching sustains
with every slot busy; `saturation` offers SATURATION_LOAD times that."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from pipeline.errors import UserError
from pipeline.generation.budget import KvBudget
from pipeline.generation.cost import StepCost
from pipeline.generation.policies import POLICIES, make_generation_policy
from pipeline.generation.scheduler import GenerationScheduler
from pipeline.generation.sequence import EXPIRED, REFUSED, GenRequest, Outcome
from pipeline.simulate.arrivals import hop_sampler
from pipeline.simulate.percentile import percentile
from pipeline.simulate.rows import RowsDist

DEFAULT_PROMPT = "lognormal:128:0.6"
DEFAULT_OUTPUT = "loguniform:8:256"  # issue 25: outputs of 8-256 tokens, most short
DEFAULT_MAX_NEW = 256
DEFAULT_LOADS = (0.25, 0.5, 0.9)
SATURATION_LOAD = 2.0
DEFAULT_DURATION = 60.0
DEFAULT_POLICIES = ("none", "static", "continuous")


@dataclass(frozen=True, slots=True)
class GenArrival:
    t: float  # arrival at the worker
    prompt_tokens: int
    output_tokens: int  # when the simulated model emits its stop token
    max_new_tokens: int
    priority: int = 0
    sent: float | None = None  # produce time, where the Kafka hop is modelled (hop_ms)

    @property
    def origin(self) -> float:
        """Produce time: what deadlines, TTFT and latency count from, as the worker
        counts them from the record's timestamp (pipeline/generation/service.py)."""
        return self.t if self.sent is None else self.sent


@dataclass
class GenWorkload:
    arrivals: list[GenArrival]
    duration: float
    load: float
    label: str  # "0.25" or "saturation"


def capacity_req_s(cost: StepCost, prompt: str, output: str, max_new_tokens: int) -> float:
    """Load 1 of a workload: its mean prompt and output (cut at max_new_tokens) on the
    curve's capacity."""
    mean_out = min(RowsDist.parse(output).mean, max_new_tokens)
    return cost.capacity_req_s(RowsDist.parse(prompt).mean, mean_out, max_new_tokens)


def make_generation_workload(
    cost: StepCost,
    load: float,
    *,
    duration: float = DEFAULT_DURATION,
    prompt: str = DEFAULT_PROMPT,
    output: str = DEFAULT_OUTPUT,
    max_new_tokens: int = DEFAULT_MAX_NEW,
    seed: int = 1,
    label: str | None = None,
    hop_ms: tuple[float, float] | None = None,
) -> GenWorkload:
    """Poisson arrivals at load × capacity for `duration` seconds. hop_ms (p50, p99):
    each reaches the worker a lognormal Kafka hop after it was produced
    (pipeline/simulate/arrivals.py hop_sampler; the final records' `to_worker_ms` at light load
    measure it)."""
    if load <= 0 or duration <= 0 or max_new_tokens < 1:
        raise UserError("the generation workload needs load > 0, duration > 0, max_new_tokens >= 1")
    prompts, outputs = RowsDist.parse(prompt), RowsDist.parse(output)
    rate = load * capacity_req_s(cost, prompt, output, max_new_tokens)
    rng = random.Random(seed)
    draw_prompt = prompts.sampler(random.Random(seed + 7919))
    draw_output = outputs.sampler(random.Random(seed + 104729))
    arrivals, t = [], 0.0
    while (t := t + rng.expovariate(rate)) < duration:
        arrivals.append(GenArrival(t, draw_prompt(), draw_output(), max_new_tokens))
    if hop_ms is not None:
        hop = hop_sampler(*hop_ms, seed=seed)
        arrivals = sorted((replace(a, t=a.t + hop(), sent=a.t) for a in arrivals), key=lambda a: a.t)
    return GenWorkload(arrivals, duration, load, label or f"{load:g}")


def parse_policy(label: str) -> tuple[str, int | None]:
    """none · static · continuous · continuous:CHUNK (chunked prefill, CHUNK prompt
    tokens per step)."""
    name, _, chunk = label.partition(":")
    if name not in POLICIES or (chunk and name != "continuous"):
        raise UserError(f"unknown generation policy {label!r}; use none, static, continuous or continuous:CHUNK")
    if not chunk:
        return name, None
    try:
        size = int(chunk)
    except ValueError:
        size = 0
    if size < 1:
        raise UserError(f"bad prefill chunk in {label!r}; use continuous:TOKENS, TOKENS >= 1")
    return name, size


@dataclass
class GenResult:
    policy: str
    load: str
    requests: int
    finished: int
    expired: int
    refused: int
    tokens_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    latency_p99_ms: float
    itl_p99_ms: float  # inter-token latency: gap between a sequence's consecutive tokens
    mean_batch: float  # sequences decoded per step, over steps that decoded any
    peak_slots: int
    peak_tokens: int  # KV tokens held at once, at most the budget's max_tokens

    def to_dict(self) -> dict:
        return asdict(self)


def run_generation(
    workload: GenWorkload, cost: StepCost, policy: str, *, noise: float = 0.1, seed: int = 1
) -> GenResult:
    """One policy over one workload."""
    name, chunk = parse_policy(policy)
    sched = GenerationScheduler(make_generation_policy(name), KvBudget(cost.max_slots, cost.max_tokens),
                                prefill_chunk=chunk)
    arrivals = workload.arrivals
    stop_at: dict[str, int] = {}
    outcomes: dict[str, Outcome] = {}
    noise_rng = random.Random(seed + 31337)
    now, i, n = 0.0, 0, len(arrivals)
    last_token: dict[str, float] = {}
    gaps: list[float] = []
    tokens_in_window = steps_decoding = decoded = peak_slots = peak_tokens = 0

    def record(o: Outcome) -> None:
        if o.request.request_id in outcomes:
            raise AssertionError(f"request {o.request.request_id} got a second outcome")
        outcomes[o.request.request_id] = o

    while True:
        while i < n and arrivals[i].t <= now:
            a = arrivals[i]
            rid = str(i)
            stop_at[rid] = a.output_tokens
            req = GenRequest(rid, a.prompt_tokens, a.max_new_tokens, a.origin, a.origin + cost.budget(a.priority),
                             a.priority)
            refused = sched.submit(req)
            if refused is not None:
                record(refused)
            i += 1
        plan = sched.plan(now)
        for o in plan.expired:
            record(o)
        if plan.empty:
            if i >= n:
                break
            now = max(now, arrivals[i].t)
            continue
        peak_slots = max(peak_slots, sched.budget.slots_used)
        service = cost.plan_time(plan)
        if noise > 0:
            service *= noise_rng.lognormvariate(-noise * noise / 2, noise)
        now += service
        emitting = plan.emitting
        # KV tokens held at the end of the step, before the finished ones retire.
        peak_tokens = max(peak_tokens, sched.tokens_in_use + plan.prefill_tokens + len(emitting))
        if now < workload.duration:
            tokens_in_window += len(emitting)
        if plan.decode:
            steps_decoding += 1
            decoded += len(plan.decode)
        for s in emitting:
            if (prev := last_token.get(s.request_id)) is not None:
                gaps.append(now - prev)
            last_token[s.request_id] = now
        stopped = [s.request_id for s in emitting if s.generated + 1 >= stop_at[s.request_id]]
        for o in sched.complete(plan, now, stopped):
            record(o)
    if len(outcomes) != n or sched.has_work:
        raise AssertionError("a request ended the run without an outcome")
    done = [o for o in outcomes.values() if o.finished]
    ttft = sorted(o.ttft for o in done if o.ttft is not None)
    lat = sorted(o.latency for o in done)
    return GenResult(
        policy=policy,
        load=workload.label,
        requests=n,
        finished=len(done),
        expired=sum(o.reason == EXPIRED for o in outcomes.values()),
        refused=sum(o.reason == REFUSED for o in outcomes.values()),
        tokens_s=tokens_in_window / workload.duration,
        ttft_p50_ms=percentile(ttft, 0.5) * 1e3,
        ttft_p99_ms=percentile(ttft, 0.99) * 1e3,
        latency_p99_ms=percentile(lat, 0.99) * 1e3,
        itl_p99_ms=percentile(sorted(gaps), 0.99) * 1e3,
        mean_batch=decoded / steps_decoding if steps_decoding else 0.0,
        peak_slots=peak_slots,
        peak_tokens=peak_tokens,
    )


def compare_generation(
    cost: StepCost,
    policies: Sequence[str] = DEFAULT_POLICIES,
    *,
    loads: Sequence[float] = DEFAULT_LOADS,
    saturation: bool = True,
    duration: float = DEFAULT_DURATION,
    prompt: str = DEFAULT_PROMPT,
    output: str = DEFAULT_OUTPUT,
    max_new_tokens: int = DEFAULT_MAX_NEW,
    seed: int = 1,
    noise: float = 0.1,
    hop_ms: tuple[float, float] | None = None,
) -> list[GenResult]:
    """Every policy on the same arrivals, per load (then at saturation)."""
    for p in policies:
        parse_policy(p)  # a bad name fails before any run
    points = [(x, None) for x in loads] + ([(SATURATION_LOAD, "saturation")] if saturation else [])
    workloads = [
        make_generation_workload(cost, x, duration=duration, prompt=prompt, output=output,
                                 max_new_tokens=max_new_tokens, seed=seed, label=lab, hop_ms=hop_ms)
        for x, lab in points
    ]
    return [run_generation(w, cost, p, noise=noise, seed=seed) for w in workloads for p in policies]


def format_generation_table(results: Sequence[GenResult]) -> str:
    head = ["policy", "load", "tokens/s", "ttft_p50_ms", "ttft_p99_ms", "lat_p99_ms", "itl_p99_ms", "finished",
            "expired", "refused", "batch"]
    rows = [[r.policy, r.load, f"{r.tokens_s:,.0f}", f"{r.ttft_p50_ms:.1f}", f"{r.ttft_p99_ms:.1f}",
             f"{r.latency_p99_ms:.1f}", f"{r.itl_p99_ms:.1f}", str(r.finished), str(r.expired), str(r.refused), f"{r.mean_batch:.1f}"]
            for r in results]
    widths = [max(len(h), *(len(x[k]) for x in rows)) for k, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if k else c.ljust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(head), *(line(r) for r in rows)])
