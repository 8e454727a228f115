"""The generation scheduler (pipeline/generation/scheduler.py): KV budget, the three
policies, admission order, expiry, one outcome per request. Driven by hand on a fake
time line: no sleeps, no model."""

from __future__ import annotations

import random

import pytest

from pipeline.generation.budget import KvBudget
from pipeline.generation.policies import make_generation_policy
from pipeline.generation.scheduler import GenerationScheduler, Plan
from pipeline.generation.sequence import (
    CANCELLED,
    EXPIRED,
    FINISH_LENGTH,
    FINISH_STOP,
    REFUSED,
    GenRequest,
    Outcome,
)


def sched(policy: str = "continuous", slots: int = 4, tokens: int = 10_000, chunk: int | None = None):
    return GenerationScheduler(make_generation_policy(policy), KvBudget(slots, tokens), prefill_chunk=chunk)


def req(rid: str, prompt: int = 4, max_new: int = 8, arrival: float = 0.0, deadline: float = 100.0,
        priority: int = 0) -> GenRequest:
    return GenRequest(rid, prompt, max_new, arrival, deadline, priority)


def ids(seqs) -> list[str]:
    return [s.request_id for s in seqs]


def step(s: GenerationScheduler, now: float, stopped=()) -> tuple[Plan, list[Outcome]]:
    plan = s.plan(now)
    return plan, ([] if plan.empty else s.complete(plan, now + 0.5, stopped))


# ---------------------------------------------------------------------------- budget
def test_slots_and_tokens_never_exceed_the_budget():
    rng = random.Random(7)
    s = sched("continuous", slots=3, tokens=60)
    for i in range(40):
        s.submit(req(str(i), prompt=rng.randint(1, 20), max_new=rng.randint(1, 30), deadline=1e9))
    stop_at = {str(i): rng.randint(1, 30) for i in range(40)}
    outcomes, now, most = [], 0.0, 0
    while s.has_work:
        plan = s.plan(now)
        assert s.budget.slots_used <= 3 and len(s.active) <= 3
        slots = [q.slot for q in s.active]
        assert len(set(slots)) == len(slots) and all(0 <= x < 3 for x in slots)
        assert s.budget.tokens_reserved <= 60
        most = max(most, len(s.active))
        now += 1.0
        stopped = [q.request_id for q in plan.emitting if q.generated + 1 >= stop_at[q.request_id]]
        outcomes += s.complete(plan, now, stopped)
        assert s.tokens_in_use <= s.budget.tokens_reserved <= 60
    assert most >= 2  # the budget, not a lack of work, was the limit
    assert len(outcomes) == 40 and s.budget.slots_used == 0 and s.budget.tokens_reserved == 0


def test_the_token_budget_holds_back_a_request_that_does_not_fit_yet():
    s = sched("continuous", slots=4, tokens=30)
    s.submit(req("a", prompt=10, max_new=10))  # reserves 20
    s.submit(req("b", prompt=5, max_new=10))  # 15 more would make 35 > 30
    plan, _ = step(s, 0.0)
    assert ids(c.sequence for c in plan.prefill) == ["a"] and s.waiting == 1


def test_a_finished_sequence_frees_its_slot_in_the_same_step():
    s = sched("continuous", slots=2)
    s.submit(req("a", prompt=3, max_new=8))
    s.submit(req("b", prompt=5, max_new=8))
    step(s, 0.0)  # both prefilled, one token each
    assert s.budget.slots_used == 2
    plan = s.plan(1.0)
    done = s.complete(plan, 1.5, stopped=["a"])
    assert [(o.request.request_id, o.reason, o.generated) for o in done] == [("a", FINISH_STOP, 2)]
    assert s.budget.slots_used == 1 and s.budget.tokens_reserved == 5 + 8 and ids(s.active) == ["b"]


def test_refused_requests_get_their_outcome_at_once():
    s = sched(slots=2, tokens=100)
    empty = s.submit(req("e", prompt=0))
    zero = s.submit(req("z", max_new=0))
    huge = s.submit(req("h", prompt=90, max_new=20))
    assert [o.reason for o in (empty, zero, huge)] == [REFUSED] * 3
    assert "empty prompt" in empty.detail and "over the KV budget of 100" in huge.detail
    assert s.submit(req("ok", prompt=80, max_new=20)) is None and s.waiting == 1


# ---------------------------------------------------------------------------- policies
def test_static_never_admits_into_a_running_batch():
    s = sched("static", slots=4)
    s.submit(req("a", max_new=2))
    s.submit(req("b", max_new=5))
    plan, _ = step(s, 0.0)
    assert sorted(ids(plan.emitting)) == ["a", "b"]
    s.submit(req("c", arrival=0.7))
    plan, done = step(s, 1.0)  # a reaches max_new_tokens: its slot idles, c still waits
    assert ids(plan.emitting) == ["a", "b"] and [o.reason for o in done] == [FINISH_LENGTH]
    for t in (2.0, 3.0, 4.0):
        plan, done = step(s, t)
        assert ids(plan.emitting) == ["b"] and s.waiting == 1
    assert [o.request.request_id for o in done] == ["b"]
    plan, _ = step(s, 5.0)  # the batch is over: the next one starts with c
    assert ids(plan.emitting) == ["c"]


def test_continuous_admits_the_next_waiting_request_on_the_step_after_a_slot_frees():
    s = sched("continuous", slots=2)
    for rid in "abc":
        s.submit(req(rid))
    plan, _ = step(s, 0.0)
    assert ids(plan.emitting) == ["a", "b"] and s.waiting == 1
    plan, done = step(s, 1.0, stopped=["a"])
    assert ids(plan.decode) == ["a", "b"] and not plan.prefill and [o.reason for o in done] == [FINISH_STOP]
    plan, _ = step(s, 2.0)
    assert ids(c.sequence for c in plan.prefill) == ["c"] and ids(plan.decode) == ["b"]
    assert [q.slot for q in s.active] == [1, 0]  # c took the slot a freed


def test_none_runs_one_sequence_at_a_time():
    s = sched("none", slots=4)
    for rid in "ab":
        s.submit(req(rid, max_new=2))
    assert ids(step(s, 0.0)[0].emitting) == ["a"]
    assert ids(step(s, 1.0)[0].emitting) == ["a"]
    assert ids(step(s, 2.0)[0].emitting) == ["b"]


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown generation policy"):
        make_generation_policy("orca")


# ---------------------------------------------------------------------------- order and expiry
def test_admission_is_edf_within_strict_priority():
    s = sched("none", slots=1)
    s.submit(req("busy", max_new=1))
    step(s, 0.0)  # frees the slot; the rest arrive and queue
    for rid, prio, deadline in [("lo-late", 1, 50), ("hi-late", 0, 40), ("lo-soon", 1, 10),
                                ("hi-soon", 0, 30), ("hi-soon-2", 0, 30)]:
        s.submit(req(rid, max_new=1, deadline=deadline, priority=prio))
    order = [ids(step(s, float(t))[0].emitting)[0] for t in range(1, 6)]
    assert order == ["hi-soon", "hi-soon-2", "hi-late", "lo-soon", "lo-late"]


def test_a_request_past_its_deadline_expires_before_admission():
    s = sched("continuous", slots=1)
    s.submit(req("running", max_new=10))
    step(s, 0.0)
    s.submit(req("tight", deadline=2.0, arrival=0.1))
    s.submit(req("loose", deadline=50.0, arrival=0.2))
    plan, _ = step(s, 1.0)
    assert not plan.expired
    plan, _ = step(s, 2.0)
    assert [(o.request.request_id, o.reason, o.at) for o in plan.expired] == [("tight", EXPIRED, 2.0)]
    assert s.waiting == 1 and ids(s.active) == ["running"]


def test_every_request_gets_exactly_one_outcome():
    rng = random.Random(3)
    s = sched("continuous", slots=3, tokens=200, chunk=8)
    n, outcomes, now = 60, [], 0.0
    for i in range(n):
        r = req(str(i), prompt=rng.randint(0, 40), max_new=rng.randint(0, 120),
                arrival=now, deadline=now + rng.choice([1.0, 5.0, 500.0]), priority=rng.randint(0, 1))
        if (o := s.submit(r)) is not None:
            outcomes.append(o)
        plan = s.plan(now)
        outcomes += plan.expired
        now += 0.5
        if not plan.empty:
            outcomes += s.complete(plan, now, [q.request_id for q in plan.emitting if rng.random() < 0.05])
    while s.has_work:
        plan = s.plan(now)
        outcomes += plan.expired
        now += 0.5
        if not plan.empty:
            outcomes += s.complete(plan, now)
    got = sorted(int(o.request.request_id) for o in outcomes)
    assert got == list(range(n))
    assert {o.reason for o in outcomes} == {FINISH_STOP, FINISH_LENGTH, EXPIRED, REFUSED}
    for o in outcomes:
        assert (o.ttft is not None) == o.finished
        if o.reason == FINISH_LENGTH:
            assert o.generated == o.request.max_new_tokens


# ---------------------------------------------------------------------------- prefill and protocol
def test_chunked_prefill_shares_a_token_budget_per_step():
    s = sched("continuous", slots=4, chunk=4)
    s.submit(req("long", prompt=10, max_new=3))
    s.submit(req("short", prompt=2, max_new=3))
    chunks = []
    for t in range(4):
        plan, _ = step(s, float(t))
        chunks.append([(c.sequence.request_id, c.start, c.tokens) for c in plan.prefill])
        if t == 2:
            # the last chunk of each prompt gives its first token
            assert ids(plan.emitting) == ["long", "short"] and not plan.decode
    assert chunks == [[("long", 0, 4)], [("long", 4, 4)], [("long", 8, 2), ("short", 0, 2)], []]
    assert s.active[0].first_token_at == 2.5


def test_a_decoding_step_attends_to_each_sequences_context():
    s = sched("continuous", slots=4)
    s.submit(req("a", prompt=5))
    s.submit(req("b", prompt=7))
    step(s, 0.0)
    plan = s.plan(1.0)
    assert plan.context_tokens == (5 + 1) + (7 + 1) and plan.prefill_tokens == 0


def test_the_caller_must_complete_each_plan_with_tokens_it_can_have():
    s = sched()
    s.submit(req("a"))
    plan = s.plan(0.0)
    with pytest.raises(RuntimeError, match="not been completed"):
        s.plan(0.1)
    with pytest.raises(ValueError, match="emitted no token"):
        s.complete(plan, 0.5, stopped=["nobody"])


def test_cancel_frees_running_slots_and_drops_waiting_requests_keeping_the_order():
    s = sched("continuous", slots=2)
    for rid in ("a", "b", "c", "d", "e"):
        s.submit(req(rid))
    plan, _ = step(s, 0.0)
    assert [c.sequence.request_id for c in plan.prefill] == ["a", "b"]
    gone = s.cancel({"a", "d"}, 1.0)
    assert sorted(o.request.request_id for o in gone) == ["a", "d"]
    assert all(o.reason == CANCELLED for o in gone)
    assert s.budget.free_slots == 1 and s.waiting == 2
    plan, _ = step(s, 2.0)
    assert [c.sequence.request_id for c in plan.prefill] == ["c"]
    assert ids(plan.decode) == ["b"]
    s.plan(3.0)
    with pytest.raises(RuntimeError):
        s.cancel({"b"}, 3.0)
