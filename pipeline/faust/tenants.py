"""Tenant classes in the Faust helper (pipeline/faust/batching.py): the worker config's
`tenants:` section as the helper takes it, the tenant id an event carries, and the
per-class outcomes the worker's publisher counts (pipeline/observe/tenant_metrics.py). The gate
itself is the worker's (pipeline/batching/tenants.py), in the helper's Batcher.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from pipeline.config.load import _coerce  # the worker config's coercions and messages
from pipeline.config.tenants import TenantsConfig, validate_tenants
from pipeline.errors import config_key_error
from pipeline.observe.tenant_metrics import TenantOutcomes


class Counted(Protocol):
    """What count_outcomes reads of an event the helper held (pipeline/faust/core.py Pending)."""

    tenant_class: str | None
    timestamp_ms: float | None


def tenants_section(data: Any) -> TenantsConfig:
    """A worker config's built `tenants` (load_config(...).tenants), or a mapping shaped
    like its `tenants:`, built with the worker config's own coercions; checked as the
    worker checks its own, one line naming the key for each mistake."""
    t = data if isinstance(data, TenantsConfig) else _coerce(data, TenantsConfig, "tenants")
    validate_tenants(t, config_key_error)
    return t


def tenant_of(prepared: Any) -> Any:
    """The tenant id a codec's Decoded carries (``.tenant``), or a dict value's "tenant"."""
    if isinstance(prepared, dict):
        return prepared.get("tenant")
    return getattr(prepared, "tenant", None)


def count_outcomes(
    outcomes: TenantOutcomes, acked: Iterable[tuple[Counted, str]], routed: Iterable[Counted], done_wall_ms: int
) -> None:
    """Per class, as the worker's publisher counts them: each scored event (ok or late,
    with its latency from the Kafka timestamp) and each routed unscored to the late
    topic; events dead-lettered by the body are no class's outcome."""
    outcomes.observe([
        (p.tenant_class, outcome == "late",
         None if p.timestamp_ms is None else max(done_wall_ms - p.timestamp_ms, 0.0) / 1000.0)
        for p, outcome in acked if p.tenant_class is not None and outcome in ("ok", "late")
    ])
    outcomes.routed([p.tenant_class for p in routed if p.tenant_class is not None])
