"""The simulator's tenant scenario (pipeline/simulate/tenants.py, issue 24): the same
arrivals through one shared queue and through the tenant gate. Short, seeded runs;
the thresholds leave room for the seed, the comparisons are the point."""

from __future__ import annotations

import pytest

from pipeline.errors import UserError
from pipeline.simulate.curves import load_curve
from pipeline.simulate.tenants import (
    BURSTER,
    SPIKE_ON,
    SPIKE_PERIOD,
    SPIKY,
    STEADY,
    compare_tenants,
    format_tenant_table,
    is_spiky,
    parse_tenant_slo,
    scenario_loads,
    tenant_classes,
    tenant_workload,
)

CURVE = load_curve("ctr")


def test_scenario_names():
    assert scenario_loads("tenants") == (2.0, 0.3)
    assert scenario_loads("tenants:5") == (5.0, 0.3)
    assert scenario_loads("tenants:5:0.28") == (5.0, 0.28)
    assert scenario_loads("tenants:2:0.3:spiky") == (2.0, 0.3) and is_spiky("tenants:2:0.3:spiky")
    assert not is_spiky("tenants:2:0.3")
    for bad in ("tenants:x", "tenants:0", "tenants:2:0.3:1", "tenants:2:0.3:spiky:1", "tenant"):
        with pytest.raises(UserError, match="bad scenario"):
            scenario_loads(bad)


def test_the_spiky_tenant_sends_its_load_in_spikes():
    w = tenant_workload(CURVE, 2.0, 6.0, spiky=True)
    spiky = [a for a in w.arrivals if a.tenant == SPIKY]
    assert sum(a.rows for a in spiky) / 6.0 / CURVE.capacity == pytest.approx(0.3, rel=0.1)
    assert all(a.t % SPIKE_PERIOD < SPIKE_ON for a in spiky)
    assert w.name == "tenants:2:0.3:spiky"


def test_each_tenant_offers_its_load():
    w = tenant_workload(CURVE, 2.0, 5.0)
    rows = {name: sum(a.rows for a in w.arrivals if a.tenant == name) for name in (*STEADY, BURSTER)}
    per_s = {name: r / 5.0 / CURVE.capacity for name, r in rows.items()}
    assert per_s[BURSTER] == pytest.approx(0.2, rel=0.1)
    assert all(per_s[name] == pytest.approx(0.3, rel=0.1) for name in STEADY)
    assert w.load == pytest.approx(1.1)
    assert [a.t for a in w.arrivals] == sorted(a.t for a in w.arrivals)


def test_classes_are_shares_of_capacity_one_slo_deep():
    classes = tenant_classes(CURVE)
    assert classes[BURSTER].rate == pytest.approx(0.1 * CURVE.capacity)
    assert classes[BURSTER].depth == pytest.approx(0.1 * CURVE.capacity * 0.05)


@pytest.mark.parametrize(("scenario", "kept", "damaged"), [("tenants:5:0.28", 0.97, 0.9), ("tenants:2", 0.95, 0.95)])
def test_the_gate_keeps_the_steady_tenants_and_gives_the_burster_its_share(scenario, kept, damaged):
    comp = compare_tenants(CURVE, scenario, duration=3.0)
    shared, gated = comp.runs["shared"].by_tenant, comp.runs["tenants"].by_tenant
    for name in STEADY:
        assert gated[name]["goodput"] >= kept
        assert gated[name]["goodput"] > shared[name]["goodput"]
        assert shared[name]["goodput"] < damaged  # the damage, without the gate
    assert gated[BURSTER]["good_share"] >= 0.1 * 0.95  # at least its share, give or take the seed
    assert gated[BURSTER]["goodput"] < shared[BURSTER]["goodput"]  # its excess pays


def test_the_burst_costs_the_steady_tenants_what_no_burst_at_all_does():
    """What keeps the steady tenants under 99 % (docs/BATCHING.md, "The burst costs the
    steady tenants nothing; the 100 % load does"): through the gate a 2x or 5x burst
    leaves them where the burster at exactly its share leaves them with no gate at all,
    and that load (100 % of capacity) is one a single tenant misses on too."""

    def worst(comp, run):
        return min(comp.runs[run].by_tenant[name]["goodput"] for name in STEADY)

    at_share = compare_tenants(CURVE, "tenants:1")
    assert 1.0 - at_share.runs["single"].slo_miss_rate < 0.99  # the load itself
    for scenario in ("tenants:2", "tenants:5"):
        burst = compare_tenants(CURVE, scenario)
        assert worst(burst, "tenants") >= worst(at_share, "shared") - 0.01
        assert worst(burst, "shared") < worst(at_share, "shared") - 0.05


def test_batches_still_mix_tenants():
    comp = compare_tenants(CURVE, "tenants:5:0.28", duration=3.0)
    gated, single = comp.runs["tenants"], comp.runs["single"]
    assert gated.mixed_batches >= 0.9 * gated.batches
    assert gated.mean_batch_rows >= 0.9 * single.mean_batch_rows
    assert comp.runs["single"].by_tenant == {} and comp.runs["single"].mixed_batches == 0
    table = format_tenant_table(comp)
    assert table.count("\n") == 9 and "steady-a" in table


def test_the_cli_prints_the_side_by_side_table(capsys):
    from pipeline.cli import main

    assert main(["simulate", "--scenario", "tenants:2", "--duration", "1"]) == 0
    out = capsys.readouterr().out
    assert "scenario tenants:2:0.3" in out and out.count("burster") == 2
    assert main(["simulate", "--scenario", "tenants:2:0.3:spiky", "--duration", "1", "--tenant-burst-ms", "200"]) == 0
    out = capsys.readouterr().out
    assert "scenario tenants:2:0.3:spiky, seed 1; buckets 200 ms of each class's rate" in out


def test_goodput_is_counted_against_each_tenants_own_sla():
    # The burster's 200 ms SLA: its requests keep their deadlines longer, so more of
    # them are in time than against the curve's 50 ms; steady-a's 30 ms: fewer.
    base = compare_tenants(CURVE, "tenants:2", duration=2.0)
    own = compare_tenants(CURVE, "tenants:2", duration=2.0, slo=parse_tenant_slo("burster=200,steady-a=30"))
    for run in ("shared", "tenants"):
        assert own.runs[run].by_tenant[BURSTER]["goodput"] > base.runs[run].by_tenant[BURSTER]["goodput"]
        assert own.runs[run].by_tenant["steady-a"]["goodput"] < base.runs[run].by_tenant["steady-a"]["goodput"]
    assert own.runs["single"].produced == base.runs["single"].produced  # no tenant there: the curve's SLO
    table = format_tenant_table(own).splitlines()
    assert table[0].split()[3] == "sla_ms"
    assert {tuple(line.split()[:4]) for line in table[1:]} >= {("tenants", BURSTER, "0.1", "200"), ("tenants", "steady-a", "0.3", "30")}


def test_buckets_deep_enough_for_noise_at_the_share_let_a_spiky_tenant_through():
    """The bucket depth trades two things (docs/BATCHING.md, "Tenants in the simulator"):
    one of 1 s of the rate keeps Poisson tenants at exactly their share green (more of
    them in time than with one SLO), and lets a tenant at its share on average, in
    spikes, take the others' deadlines."""
    def steady(scenario: str, burst_s: float | None, names=STEADY) -> float:
        gated = compare_tenants(CURVE, scenario, duration=3.0, burst_s=burst_s).runs["tenants"].by_tenant
        return min(gated[n]["goodput"] for n in names)

    assert steady("tenants:2", 1.0) > steady("tenants:2", None)
    others = [n for n in STEADY if n != SPIKY]
    assert steady("tenants:2:0.3:spiky", None, others) >= 0.98 > 0.96 > steady("tenants:2:0.3:spiky", 1.0, others)
    assert tenant_classes(CURVE, burst_s=1.0)[BURSTER].depth == pytest.approx(0.1 * CURVE.capacity)
    with pytest.raises(UserError, match="tenant-burst-ms"):
        compare_tenants(CURVE, "tenants", duration=1.0, burst_s=0.0)


def test_a_tenants_class_bucket_is_its_own_sla_deep():
    classes = tenant_classes(CURVE, slo={BURSTER: 0.2})
    assert classes[BURSTER].depth == pytest.approx(0.1 * CURVE.capacity * 0.2)
    assert classes["steady-a"].depth == pytest.approx(0.3 * CURVE.capacity * 0.05)


@pytest.mark.parametrize("bad", ["nobody=30", "burster=0", "burster=x", "burster"])
def test_bad_tenant_slo_is_one_line(bad):
    with pytest.raises(UserError, match="bad --tenant-slo"):
        parse_tenant_slo(bad)
    assert parse_tenant_slo(None) == {} and parse_tenant_slo("steady-b=80") == {"steady-b": 0.08}
