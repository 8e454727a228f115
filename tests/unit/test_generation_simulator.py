"""The generation simulator (pipeline/generation/simulate.py), its curve file
(pipeline/generation/cost.py) and `tidebatch simulate --workload generate`; and issue
25's targets in simulation, on shorter runs than docs/GENERATION.md's table."""

from __future__ import annotations

import json
from functools import cache

import pytest

from pipeline.cli import build_parser
from pipeline.errors import UserError
from pipeline.generation.cost import load_step_cost, step_cost_from_dict
from pipeline.generation.simulate import (
    DEFAULT_OUTPUT,
    DEFAULT_PROMPT,
    capacity_req_s,
    compare_generation,
    make_generation_workload,
    parse_policy,
    run_generation,
)
from pipeline.simulate.curves import load_curve
from pipeline.simulate.rows import RowsDist

SEED = 1
DURATION = 20.0


@cache
def results():
    cost = load_step_cost("generation-assumed")
    table = compare_generation(cost, ("none", "static", "continuous"), duration=DURATION, seed=SEED)
    return {(r.policy, r.load): r for r in table}


def test_the_shipped_curve_is_marked_assumed_and_each_loader_refuses_the_others_kind():
    cost = load_step_cost("generation-assumed")
    assert cost.assumed and "ASSUMED" in cost.source
    assert (cost.a, cost.b, cost.p, cost.max_slots) == pytest.approx((8e-3, 0.15e-3, 0.02e-3, 32))
    assert cost.step_time(10, 1000, 50) == pytest.approx(8e-3 + 10 * 0.15e-3 + 1000 * 1e-7 + 50 * 2e-5)
    with pytest.raises(UserError, match="is a 'generation' curve"):
        load_curve("generation-assumed")
    with pytest.raises(UserError, match="is a 'batch' curve"):
        load_step_cost("ctr")
    with pytest.raises(UserError, match="bad or missing field"):
        step_cost_from_dict({"kind": "generation", "step_ms": 1}, "x")


def test_the_measured_curve_of_the_shipped_decoder_is_marked_measured_and_loads():
    """pipeline/curves/generation-decoder-tiny-cpu.json, written by `tidebatch profile
    generate` (docs/GENERATION.md, "The simulator against the pipeline"): a step's fixed
    cost small beside its rows', the opposite of the assumed GPU-shaped curve, charged
    for the rows the in-place call computes."""
    cost = load_step_cost("generation-decoder-tiny-cpu")
    assert not cost.assumed and "tidebatch profile generate" in cost.source and cost.counts == "computed"
    assert (cost.max_slots, cost.max_tokens) == (16, 16 * 256)
    assert 0 < cost.a < 16 * cost.b + 16 * 100 * cost.c  # 16 rows at ~100 tokens outweigh the step


def test_the_workload_offers_the_asked_load():
    cost = load_step_cost("generation-assumed")
    w = make_generation_workload(cost, 0.5, duration=DURATION, seed=SEED)
    rate = 0.5 * capacity_req_s(cost, DEFAULT_PROMPT, DEFAULT_OUTPUT, 256)
    assert len(w.arrivals) / DURATION == pytest.approx(rate, rel=0.1)
    outs = [a.output_tokens for a in w.arrivals]
    assert min(outs) >= 8 and max(outs) <= 256
    assert sum(outs) / len(outs) == pytest.approx(RowsDist.parse(DEFAULT_OUTPUT).mean, rel=0.1)


def test_figures_are_deterministic_for_a_seed():
    cost = load_step_cost("generation-assumed")
    w = make_generation_workload(cost, 0.9, duration=5.0, seed=SEED)
    first = run_generation(w, cost, "continuous:64", seed=SEED)
    assert run_generation(w, cost, "continuous:64", seed=SEED) == first
    other = make_generation_workload(cost, 0.9, duration=5.0, seed=SEED + 1)
    assert run_generation(other, cost, "continuous:64", seed=SEED + 1) != first


def test_every_request_ends_once_within_the_kv_budget():
    cost = load_step_cost("generation-assumed")
    for r in results().values():
        assert r.finished + r.expired + r.refused == r.requests
        assert r.peak_slots <= cost.max_slots and r.peak_tokens <= cost.max_tokens
    assert results()[("continuous", "saturation")].peak_slots == cost.max_slots


def test_continuous_doubles_static_token_throughput_at_saturation():
    res = results()
    assert res[("continuous", "saturation")].tokens_s >= 2 * res[("static", "saturation")].tokens_s


@pytest.mark.parametrize("load", ["0.25", "0.5", "0.9"])
def test_continuous_has_the_lower_time_to_first_token_p99_at_every_load(load):
    # The loads. At saturation every policy's TTFT p99 is its wait up to the
    # admission deadline (10 s on this curve): a figure of the deadline, not the policy.
    res = results()
    assert res[("continuous", load)].expired == 0
    assert res[("continuous", load)].ttft_p99_ms < res[("static", load)].ttft_p99_ms
    assert res[("continuous", load)].ttft_p99_ms < res[("none", load)].ttft_p99_ms


def test_policy_labels():
    assert parse_policy("continuous:512") == ("continuous", 512)
    assert parse_policy("static") == ("static", None)
    for bad in ("static:8", "continuous:0", "orca"):
        with pytest.raises(UserError):
            parse_policy(bad)


def test_the_simulate_command_runs_the_generation_workload(capsys):
    argv = ["simulate", "--workload", "generate", "--duration", "3", "--load", "0.5", "--no-saturation", "--json"]
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["curve"]["assumed"] is True
    assert [(r["policy"], r["load"]) for r in doc["results"]] == [("none", "0.5"), ("static", "0.5"), ("continuous", "0.5")]
    args = build_parser().parse_args(["simulate", "--workload", "generate", "--scenario", "burst"])
    with pytest.raises(UserError, match="Poisson arrivals only"):
        args.func(args)


def test_a_kafka_hop_delays_arrival_and_counts_in_ttft_and_deadlines():
    # The worker counts TTFT and the admission deadline from the record's timestamp
    # (pipeline/generation/service.py): so does the simulator once the hop is modelled.
    cost = load_step_cost("generation-assumed")
    plain = make_generation_workload(cost, 0.1, duration=5.0, seed=SEED)
    hopped = make_generation_workload(cost, 0.1, duration=5.0, seed=SEED, hop_ms=(20.0, 40.0))
    assert sorted(a.origin for a in hopped.arrivals) == [a.t for a in plain.arrivals]
    hops = sorted((a.t - a.origin) * 1e3 for a in hopped.arrivals)
    assert hops[0] > 0 and 15 <= hops[len(hops) // 2] <= 25 and hops[-1] < 80
    assert [a.t for a in hopped.arrivals] == sorted(a.t for a in hopped.arrivals)
    base = run_generation(plain, cost, "continuous", seed=SEED)
    late = run_generation(hopped, cost, "continuous", seed=SEED)
    assert late.ttft_p50_ms - base.ttft_p50_ms == pytest.approx(20.0, abs=5.0)
    # a hop longer than the whole budget: every request expires before it is admitted
    lost = make_generation_workload(cost, 0.1, duration=2.0, seed=SEED,
                                    hop_ms=(cost.budget(0) * 1e3 * 2, cost.budget(0) * 1e3 * 3))
    r = run_generation(lost, cost, "continuous", seed=SEED)
    assert r.finished == 0 and r.expired == r.requests > 0


def test_computed_counts_charge_the_in_place_slot_range_and_padded_prefill():
    # The in-place decoding call runs every slot between the lowest and highest decoded
    # one, finished ones too, and one prefill call pads every chunk to the longest
    # (pipeline/generation/runner.py): "computed" charges that, "live" what is decoded.
    from pipeline.generation.budget import KvBudget
    from pipeline.generation.cost import plan_counts
    from pipeline.generation.policies import make_generation_policy
    from pipeline.generation.scheduler import GenerationScheduler
    from pipeline.generation.sequence import GenRequest

    sched = GenerationScheduler(make_generation_policy("static"), KvBudget(4, 4 * 256))
    for rid, prompt, new in (("a", 10, 2), ("b", 4, 9), ("c", 6, 2), ("d", 3, 9)):
        assert sched.submit(GenRequest(rid, prompt, new, 0.0, 1e9, 0, None)) is None
    first = sched.plan(0.0)  # the batch's prefill: four chunks padded to the longest
    assert plan_counts(first, "live") == (0, 0, 23)
    assert plan_counts(first, "computed") == (0, 0, 4 * 10)
    sched.complete(first, 0.0, [])
    second = sched.plan(0.0)
    sched.complete(second, 0.0, ["a", "c"])  # a and c end: slots 0 and 2 free in the batch
    third = sched.plan(0.0)
    slots = sorted(s.slot for s in third.decode)
    assert slots == [1, 3]
    assert plan_counts(third, "live")[0] == 2 and plan_counts(third, "computed")[0] == 3
    cost = step_cost_from_dict({"step_ms": 1, "ms_per_sequence": 1, "prefill_ms_per_token": 0, "max_slots": 4,
                                "max_tokens": 1024, "counts": "computed"})
    assert cost.plan_time(third) == pytest.approx((1 + 3) / 1e3)
    with pytest.raises(UserError, match="counts must be one of live, computed"):
        step_cost_from_dict({**cost.to_dict(), "counts": "padded"})
