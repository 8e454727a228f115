"""One ops view of the N worker processes of `tidebatch run --processes N`
(pipeline/app/children.py), from what each child's loopback endpoints answered. Pure:
the fetching is pipeline/ops/host_http.py's.

/metrics: every child's series merged into one exposition. Counters and histograms
sum (same name and labels); gauges that are one process's state (queue depth, in
flight, readiness, assigned partitions, lag: everything not in SHARED_GAUGES) keep one
series per child with a `process="i"` label, so a sum over `process` is the host's
total and `tidebatch status` (which sums a pipeline's series) reads the whole host;
gauges every child holds the same value of (the SLO, a tenant class's share) are one
series, their max. `_created` samples take the earliest child's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.ops.stats import SLO

# Gauges whose value is the same in every child (config, or a ratio of the class's
# share): one series, the max, no process label (pipeline/ops/stats.py merges them so).
SHARED_GAUGES = frozenset({SLO, "tidebatch_tenant_slo_seconds", "tidebatch_tenant_share_used",
                           "tidebatch_tenant_share_served", "tidebatch_model_info", "tidebatch_build_info"})
PROCESS_LABEL = "process"


@dataclass
class ChildView:
    """One child as the parent sees it: `port` None until it wrote it; `metrics`,
    `ready`, `stats` what its endpoints answered (None: no answer, `error` says why)."""

    index: int
    pid: int | None
    alive: bool
    port: int | None = None
    restarts: int = 0
    metrics: str | None = None
    ready: tuple[bool, dict[str, Any]] | None = None
    stats: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def merge_metrics(children: Sequence[tuple[int, str]]) -> str:
    """Prometheus text of each child (index, text) -> one Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, tuple[str, str]] = {}  # name -> (type, help)
    series: dict[str, dict[tuple, float]] = {}  # family -> (sample, labels) -> value
    for index, text in children:
        for fam in text_string_to_metric_families(text):
            families.setdefault(fam.name, (fam.type, fam.documentation))
            target = series.setdefault(fam.name, {})
            created = fam.name.endswith("_created")  # a counter's start time, its own family in text 0.0.4
            per_process = fam.type in ("gauge", "unknown") and fam.name not in SHARED_GAUGES and not created
            for s in fam.samples:
                labels = dict(s.labels)
                if per_process:
                    labels[PROCESS_LABEL] = str(index)
                key = (s.name, tuple(sorted(labels.items())))
                if key not in target:
                    target[key] = s.value
                elif s.name.endswith("_created"):
                    target[key] = min(target[key], s.value)
                elif fam.name in SHARED_GAUGES:
                    target[key] = max(target[key], s.value)
                else:
                    target[key] += s.value
    lines: list[str] = []
    for name, (kind, doc) in families.items():
        lines.append(f"# HELP {name} {_escape_help(doc)}")
        lines.append(f"# TYPE {name} {'untyped' if kind == 'unknown' else kind}")
        for (sample, labels), value in series[name].items():
            lines.append(f"{sample}{_labels(labels)} {_value(value)}")
    return "\n".join(lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc, strict=True)) + "}"


def _value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))


def host_liveness(children: Sequence[ChildView], supervisor_ok: bool = True) -> tuple[bool, dict[str, Any]]:
    """Alive while every child process lives (one being restarted is not alive)."""
    dead = [c.index for c in children if not c.alive]
    ok = supervisor_ok and not dead and bool(children)
    body: dict[str, Any] = {"alive": ok, "processes": len(children)}
    if dead:
        body["reason"] = "process " + ", ".join(map(str, dead)) + " not running"
    return ok, body


def host_readiness(children: Sequence[ChildView]) -> tuple[bool, dict[str, Any]]:
    """Ready only when every child is: the body names each child that is not, and why."""
    not_ready: dict[str, str] = {}
    for c in children:
        if not c.alive:
            not_ready[str(c.index)] = "not running"
        elif c.ready is None:
            not_ready[str(c.index)] = c.error or "starting: no ops port yet"
        elif not c.ready[0]:
            body = c.ready[1]
            not_ready[str(c.index)] = str(body.get("reason") or body.get("reasons") or body)
    ok = bool(children) and not not_ready
    out: dict[str, Any] = {"ready": ok, "processes": len(children)}
    if not_ready:
        out["not_ready"] = not_ready
        out["reason"] = "; ".join(f"process {i}: {why}" for i, why in not_ready.items())
    return ok, out


_SUMMED_STATS = ("consumed", "scored", "scored_late", "routed_late", "dlq", "batches", "commits", "pauses")


def host_worker_info(children: Sequence[ChildView], ready: bool) -> dict[str, Any]:
    """/api/stats' `worker` for the host: the first answering child's description, the
    partitions and counters of all, and one entry per process."""
    infos = [(c, c.stats.get("worker", {})) for c in children if c.stats]
    first = infos[0][1] if infos else {}
    totals: dict[str, Any] = {}
    for _, info in infos:
        for k in _SUMMED_STATS:
            v = info.get("stats", {}).get(k)
            if isinstance(v, int | float):
                totals[k] = totals.get(k, 0) + v
    return {
        **{k: first.get(k) for k in ("pipeline", "policy", "group_id", "input_topic", "provider",
                                       "model_version", "slo_ms")},
        "assigned": sorted(p for _, info in infos for p in info.get("assigned", [])),
        "started": bool(infos) and len(infos) == len(children) and all(i.get("started") for _, i in infos),
        "ready": ready,
        "stats": totals,
        "processes": [
            {"index": c.index, "pid": c.pid, "alive": c.alive, "port": c.port, "restarts": c.restarts,
             **({"error": c.error} if c.error else {}),
             **{k: (c.stats or {}).get("worker", {}).get(k) for k in ("assigned", "ready", "stats")},
             **c.extra}
            for c in children
        ],
    }
