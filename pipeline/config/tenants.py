"""The `tenants` section of the worker config: tenant classes, each with an SLA, a
guaranteed share of capacity and a burst ceiling (docs/BATCHING.md, "Tenants").

    tenants:
      capacity_rows_per_s: 20000     # what the shares are fractions of
      classes:
        gold:
          share: 0.3                 # guaranteed: 6000 rows/s ahead of anyone's excess
          ceiling_rows_per_s: 9000   # beyond: `beyond`; absent: no ceiling
          beyond: shed               # queue (default) | shed (late topic) | score_late
          slo_ms: 30                 # default: batching.slo_ms
          priority_slo_ms: {1: 80}   # default: batching.priority_slo_ms
          burst_ms: 50               # bucket depth in ms of the rate; default the SLO
          members: [acme, globex]    # tenant ids; a tenant named like a class is in it
        default:                     # tenants in no class; absent: best effort
          share: 0.1

No section (no classes): one shared queue, as before. The gate itself is
pipeline/batching/tenants.py; requests carry `tenant` from their codec
(pipeline/codecs/base.py Decoded.tenant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.batching.tenants import BEYOND_ACTIONS, DEFAULT_CLASS, TenantClass, TenantGate


@dataclass
class TenantClassConfig:
    share: float = 0.0
    ceiling_rows_per_s: float | None = None
    beyond: str = "queue"
    slo_ms: float | None = None
    priority_slo_ms: dict[int, float] = field(default_factory=dict)
    burst_ms: float | None = None
    members: list[str] = field(default_factory=list)


@dataclass
class TenantsConfig:
    capacity_rows_per_s: float | None = None
    classes: dict[str, TenantClassConfig] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.classes)


def validate_tenants(t: TenantsConfig, bad: Callable[[str, str], Exception]) -> None:
    """One line naming the key for each mistake; nothing to check without classes."""
    if not t.enabled:
        return
    if t.capacity_rows_per_s is None or t.capacity_rows_per_s <= 0:
        raise bad("tenants.capacity_rows_per_s", "needs a value > 0 with tenant classes: the rows/s the shares are fractions of")
    seen: dict[str, str] = {}
    for name, c in t.classes.items():
        key = f"tenants.classes.{name}"
        if not 0.0 <= c.share <= 1.0:
            raise bad(f"{key}.share", "must be within [0, 1] (a fraction of capacity_rows_per_s)")
        if c.ceiling_rows_per_s is not None and c.ceiling_rows_per_s < c.share * t.capacity_rows_per_s:
            raise bad(f"{key}.ceiling_rows_per_s", "must be >= the class's guaranteed rate (share × capacity_rows_per_s)")
        if c.beyond not in BEYOND_ACTIONS:
            raise bad(f"{key}.beyond", f"{c.beyond!r} is not one of {', '.join(BEYOND_ACTIONS)}")
        for sub, ms in (("slo_ms", c.slo_ms), ("burst_ms", c.burst_ms), *((f"priority_slo_ms.{p}", v) for p, v in c.priority_slo_ms.items())):
            if ms is not None and ms <= 0:
                raise bad(f"{key}.{sub}", "must be > 0")
        for tenant in c.members:
            if tenant in seen:
                raise bad(f"{key}.members", f"tenant {tenant!r} is already in class {seen[tenant]!r}")
            seen[tenant] = name
    total = sum(c.share for c in t.classes.values())
    if total > 1.0 + 1e-9:
        raise bad("tenants.classes", f"the shares add up to {total:g}, over 1: capacity cannot cover the guarantees")


def class_budget_ms(c: TenantClassConfig, batching: Any, priority: int) -> float:
    """A class's deadline budget for a priority: its own, else the batching section's."""
    if priority in c.priority_slo_ms:
        return c.priority_slo_ms[priority]
    if c.slo_ms is not None:
        return c.slo_ms
    return batching.priority_slo_ms.get(priority, batching.slo_ms)


def tenant_gate(t: TenantsConfig, batching: Any) -> TenantGate | None:
    """The batcher's gate, or None without classes. A bucket is burst_ms of the class's
    rate deep, by default its SLO (priority 0): what the pipeline can absorb within
    one deadline, so the buckets of all classes together still fit one deadline."""
    if not t.enabled or t.capacity_rows_per_s is None:
        return None
    classes = {}
    for name, c in t.classes.items():
        depth_s = (c.burst_ms if c.burst_ms is not None else class_budget_ms(c, batching, 0)) / 1000.0
        rate = c.share * t.capacity_rows_per_s
        ceiling = c.ceiling_rows_per_s
        classes[name] = TenantClass(
            name, rate, rate * depth_s, ceiling, (ceiling or 0.0) * depth_s, c.beyond
        )
    members = {tenant: name for name, c in t.classes.items() for tenant in c.members}
    return TenantGate(classes, members)


def priority_budget_ms(batching: Any) -> Callable[[int], float]:
    """Admission's deadline budget by priority: the batching section's SLO for it, in ms
    (tenant classes add their own, tenant_budget_ms)."""
    by_priority, slo_ms = dict(batching.priority_slo_ms), batching.slo_ms

    def budget(priority: int) -> float:
        return float(by_priority.get(priority, slo_ms))

    return budget


def tenant_budget_ms(
    t: TenantsConfig, batching: Any, gate: TenantGate | None
) -> Callable[[str | None, int], float] | None:
    """Admission's deadline budget by (tenant id, priority), or None without classes.
    gate: the batcher's (tenant_gate), whose class_of sorts a tenant into its class."""
    if gate is None:
        return None

    def budget(tenant: str | None, priority: int) -> float:
        c = t.classes.get(gate.class_of(tenant))
        if c is None:  # an undeclared default class: the batching section's SLO
            return batching.priority_slo_ms.get(priority, batching.slo_ms)
        return class_budget_ms(c, batching, priority)

    return budget


def class_slo_seconds(t: TenantsConfig, batching: Any) -> dict[str, float]:
    """Each class's budget for priority 0 in seconds (default too, declared or not)."""
    out = {name: class_budget_ms(c, batching, 0) / 1000.0 for name, c in t.classes.items()}
    out.setdefault(DEFAULT_CLASS, batching.priority_slo_ms.get(0, batching.slo_ms) / 1000.0)
    return out


def max_budget_ms(t: TenantsConfig, batching: Any) -> float:
    """The loosest budget any request can have: older than this it is late whatever it
    is (admission.py routes those before decoding)."""
    budgets = [batching.slo_ms, *batching.priority_slo_ms.values()]
    for c in t.classes.values():
        budgets += [class_budget_ms(c, batching, p) for p in (0, *c.priority_slo_ms, *batching.priority_slo_ms)]
    return max(budgets)

