"""The `tenants:` section (pipeline/config/tenants.py): loading, one-line errors naming
the key, the gate and the deadline budgets it gives the worker, and admission carrying
the tenant."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from consumers.records import SourceRecord
from pipeline.batching.tenants import GREEN
from pipeline.codecs.base import Decoded
from pipeline.config import load_config
from pipeline.config.tenants import class_slo_seconds, max_budget_ms, tenant_budget_ms, tenant_gate
from pipeline.errors import UserError
from pipeline.worker.admission import Admission

TENANTS = {
    "capacity_rows_per_s": 1000,
    "classes": {
        "gold": {"share": 0.5, "slo_ms": 20, "priority_slo_ms": {1: 300}, "members": ["acme"],
                 "ceiling_rows_per_s": 600, "beyond": "shed"},
        "default": {"share": 0.1},
    },
}


def cfg(tenants: dict | None = None):
    return load_config(overrides={"tenants": TENANTS if tenants is None else tenants}, environ={})


def test_no_section_no_gate_and_the_batching_budgets():
    c = load_config(environ={})
    assert not c.tenants.enabled
    assert tenant_gate(c.tenants, c.batching) is None and tenant_budget_ms(c.tenants, c.batching, tenant_gate(c.tenants, c.batching)) is None
    assert max_budget_ms(c.tenants, c.batching) == c.batching.slo_ms


def test_classes_become_a_gate_with_rates_depths_and_members():
    c = cfg()
    gate = tenant_gate(c.tenants, c.batching)
    assert gate is not None
    gold = gate.classes["gold"]
    assert (gold.rate, gold.depth, gold.ceiling, gold.beyond) == (500.0, 10.0, 600.0, "shed")  # 20 ms deep
    assert gate.class_of("acme") == "gold" and gate.class_of("gold") == "gold" and gate.class_of("x") == "default"


def test_budgets_per_tenant_and_priority_fall_back_to_the_batching_section():
    c = cfg()
    budget = tenant_budget_ms(c.tenants, c.batching, tenant_gate(c.tenants, c.batching))
    assert budget is not None
    assert budget("acme", 0) == 20 and budget("acme", 1) == 300
    assert budget("stranger", 0) == c.batching.slo_ms  # default declares no SLO
    assert max_budget_ms(c.tenants, c.batching) == 300
    assert class_slo_seconds(c.tenants, c.batching) == {"gold": 0.02, "default": c.batching.slo_ms / 1000}


@pytest.mark.parametrize(
    ("tenants", "key"),
    [
        ({"classes": {"a": {"share": 0.5}}}, "tenants.capacity_rows_per_s"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"share": 1.5}}}, "tenants.classes.a.share"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"share": 0.6}, "b": {"share": 0.6}}}, "tenants.classes"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"share": 0.5, "ceiling_rows_per_s": 4}}}, "tenants.classes.a.ceiling_rows_per_s"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"beyond": "drop"}}}, "tenants.classes.a.beyond"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"slo_ms": 0}}}, "tenants.classes.a.slo_ms"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"priority_slo_ms": {1: -1}}}}, "tenants.classes.a.priority_slo_ms.1"),
        ({"capacity_rows_per_s": 10, "classes": {"a": {"members": ["t"]}, "b": {"members": ["t"]}}}, "tenants.classes.b.members"),
    ],
)
def test_bad_sections_name_the_key_in_one_line(tenants, key):
    with pytest.raises(UserError) as err:
        cfg(tenants)
    assert f"'{key}'" in str(err.value) and "\n" not in str(err.value)


class Outcomes:
    def dead_letter(self, rec, reason, stage, *, error=None) -> None:
        raise AssertionError(reason)

    def late(self, routed, now_wall, rule) -> None:
        raise AssertionError("nothing is late here")


class TenantCodec:
    name = "tenant"

    def decode(self, value: bytes | None, headers: Mapping[str, bytes] | None) -> Decoded:
        assert value is not None
        tenant, _, prio = value.decode().partition(":")
        return Decoded(request_id=value.decode(), rows=1, payload=value, priority=int(prio or 0), tenant=tenant or None)


def test_admission_carries_the_tenant_and_gives_its_class_deadline():
    c = cfg()
    wall = 1_700_000_000_000
    adm = Admission(TenantCodec(), lambda p: 999.0, Outcomes(), 10_000, None, tenant_budget_ms(c.tenants, c.batching, tenant_gate(c.tenants, c.batching)))
    recs = [SourceRecord("in", 0, i, b"k", v, {}, wall) for i, v in enumerate((b"acme", b"acme:1", b"x", b""))]
    reqs = adm.admit(recs, now=5.0, now_wall=wall)
    assert [r.tenant for r in reqs] == ["acme", "acme", "x", None]
    assert [round((r.deadline - 5.0) * 1000) for r in reqs] == [20, 300, c.batching.slo_ms, c.batching.slo_ms]
    gate = tenant_gate(c.tenants, c.batching)
    assert gate is not None
    assert [gate.mark(r, 5.0) for r in reqs] == [GREEN] * 4
    assert [r.tenant_class for r in reqs] == ["gold", "gold", "default", "default"]
    without = Admission(TenantCodec(), lambda p: 999.0, Outcomes(), 10_000)
    assert [round((r.deadline - 5.0) * 1000) for r in without.admit(recs, now=5.0, now_wall=wall)] == [999] * 4


def test_the_worker_batcher_gets_the_gate_only_with_a_section():
    from pipeline.app.compose import batch_queue
    from pipeline.batching.cost import CostModel
    from pipeline.batching.policies import GreedyPolicy
    from pipeline.clock import FakeClock

    def batcher(c):
        return batch_queue(c, GreedyPolicy(8), CostModel(), FakeClock(), 1, 8).batcher

    assert batcher(load_config(environ={})).tenants is None
    assert set(batcher(cfg()).tenants.classes) == {"gold", "default"}
