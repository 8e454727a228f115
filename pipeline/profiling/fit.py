"""From measured points to what `tidebatch profile` writes: t(n) = a + b·n per
configuration (the simulator's own fitter, pipeline/simulate/curves.py `_fit_points`), the
batch cap worth running, the best configuration and its worker config snippet. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import yaml

from pipeline.profiling.sweep import Point, Setting
from pipeline.simulate.curves import Curve, curve_from_dict

# The cap is the largest measured batch within this share of the best measured rows/s:
# the adaptive policy forms full batches only through a backlog, and there each batch
# also costs the worker per-batch work the model's curve does not show (hand-overs,
# GIL waits: bench/pipeline_capacity.py ran ~10 % slower at 512 than at 1024 rows). A
# batch size past the best is kept out only when it is really slower per row (CenterFace
# frames: docs/ARCHITECTURE.md, "Batch caps per pipeline").
CAP_SHARE = 0.95

@dataclass(frozen=True)
class Fitted:
    """One configuration's measurements and fit."""

    setting: Setting
    points: list[Point]
    curve: Curve  # fitted to the points' cost (Point.cost_ms), capped at max_batch_rows
    document: dict  # the curve file (curve_document)

    @property
    def capacity(self) -> float:
        """Rows/s of the model stage with full batches back to back."""
        return self.curve.capacity


def batch_cap(points: Sequence[Point], executor: str, share: float = CAP_SHARE) -> int:
    """Rows of the largest measured batch whose rows/s is within `share` of the best."""
    rate = {p.rows: p.rows / p.cost_ms(executor) for p in points if p.cost_ms(executor) > 0}
    best = max(rate.values())
    return max(rows for rows, r in rate.items() if r >= share * best)


def curve_document(
    name: str, setting: Setting, points: Sequence[Point], slo_ms: Mapping[int, float], source: str
) -> dict:
    """The curve file `tidebatch simulate --curve FILE` reads (pipeline/simulate/curves.py
    `load_curve`): the (rows, ms) points it fits itself, the batch cap and the SLO, plus
    the raw measurements and the setting for the reader."""
    return {
        "name": name,
        "source": source,
        "points": [[p.rows, round(p.cost_ms(setting.executor), 6)] for p in points],
        "max_batch_rows": batch_cap(points, setting.executor),
        "slo_ms": {str(k): v for k, v in sorted(slo_ms.items())},
        "setting": {"executor": setting.executor, "intra_op_threads": setting.threads},
        "measured": [
            {"requests": p.requests, "rows": p.rows, "call_ms": round(p.ms, 6), "model_ms": round(p.model_ms, 6),
             "repeats": p.repeats}
            for p in points
        ],
    }


def fit(name: str, setting: Setting, points: Sequence[Point], slo_ms: Mapping[int, float], source: str) -> Fitted:
    doc = curve_document(name, setting, points, slo_ms, source)
    return Fitted(setting, list(points), curve_from_dict(doc, name), doc)


def best(fitted: Sequence[Fitted], ceiling: float = math.inf,
         capacity: Callable[[Fitted], float] | None = None) -> Fitted:
    """The highest capacity, where no configuration can beat `ceiling` rows/s, or by
    `capacity`, a worker's in each configuration (pipeline/profiling/capacity.py); on
    a tie (within 2 %, below this machine's noise) fewer threads, then in-process: the
    worker's defaults, cheaper on cores and on latency at half load
    (docs/OPERATIONS.md, "Capacity of one worker")."""
    rate = {id(f): capacity(f) if capacity else min(f.capacity, ceiling) for f in fitted}
    top = max(rate.values())
    close = [f for f in fitted if rate[id(f)] >= 0.98 * top]
    return min(close, key=lambda f: (f.setting.threads, f.setting.executor != "in-process", -f.capacity))


def recommended_config(pipeline: str, chosen: Fitted, policy: str, slo_ms: float) -> str:
    """The worker config (pipeline/config/sections.py key names) for the chosen configuration."""
    doc = {
        "pipeline": pipeline,
        "batching": {"policy": policy, "max_batch_rows": chosen.curve.max_batch_rows, "slo_ms": slo_ms},
        "runtime": {
            "model_process": chosen.setting.executor == "model-process",
            "intra_op_threads": chosen.setting.threads,
        },
    }
    return yaml.safe_dump(doc, sort_keys=False)
