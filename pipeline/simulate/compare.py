"""A comparison: every policy over the same arrivals of one scenario (per load, where
loads apply), static-tuned first tuned by grid search (`tidebatch simulate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.simulate.curves import Curve
from pipeline.simulate.engine import SimConfig, simulate
from pipeline.simulate.results import RunResult
from pipeline.simulate.rows import DEFAULT_ROWS
from pipeline.simulate.specs import policy_spec
from pipeline.simulate.tuning import tune_static
from pipeline.simulate.workload import default_duration, is_steady, make_workload


@dataclass
class Comparison:
    """Every policy over one scenario (and each load, where loads apply)."""

    curve: Curve
    scenario: str
    results: list[RunResult]
    tuned: tuple[int, float] | None = None
    tune_table: list[tuple[int, float, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        c = self.curve
        return {
            "curve": {"name": c.name, "a_ms": c.a * 1e3, "b_ms_per_row": c.b * 1e3,
                      "max_batch_rows": c.max_batch_rows, "capacity_rows_s": c.capacity,
                      "slo_ms": {str(k): v * 1e3 for k, v in c.slo.items()}, "source": c.source},
            "scenario": self.scenario,
            "static_tuned": None if self.tuned is None else {
                "max_batch_rows": self.tuned[0], "max_queue_delay_ms": self.tuned[1] * 1e3,
                "grid_p99_ms": [{"rows": r, "delay_ms": d, "p99_ms": p} for r, d, p in self.tune_table],
            },
            "results": [r.to_dict() for r in self.results],
        }


def compare(
    curve: Curve,
    scenario: str,
    policies: Sequence[str],
    *,
    loads: Sequence[float] = (0.5,),
    duration: float | None = None,
    rows: str = DEFAULT_ROWS,
    seed: int = 1,
    cfg: SimConfig | None = None,
    tune_duration: float | None = None,
    hop_ms: tuple[float, float] | None = None,
) -> Comparison:
    """Run each policy on the same arrivals (per load) and collect the results;
    hop_ms (p50, p99): the Kafka hop before the worker (with_hops)."""
    cfg = cfg or SimConfig(seed=seed)
    steady = is_steady(scenario)
    dur = duration if duration is not None else default_duration(scenario)
    # Arrivals first: a bad scenario or duration fails before the grid search runs.
    workloads = [
        make_workload(scenario, curve, load=load or 0.0, duration=dur, rows=rows, seed=seed, hop_ms=hop_ms)
        for load in (loads if steady else (None,))
    ]
    tuned, table = None, []
    if "static-tuned" in policies:
        tuned, table = tune_static(curve, rows=rows, seed=seed, duration=tune_duration, cfg=cfg)
    specs = [policy_spec(p, curve, tuned) for p in policies]
    results = [simulate(w, curve, spec, cfg) for w in workloads for spec in specs]
    return Comparison(curve, scenario, results, tuned, table)
