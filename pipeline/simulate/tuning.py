"""static-tuned: the static configuration (rows, linger) with the lowest p99 on Poisson
arrivals, found by grid search in the simulator, so static is compared at its best."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.simulate.curves import Curve
from pipeline.simulate.engine import SimConfig, simulate
from pipeline.simulate.rows import DEFAULT_ROWS, RowsDist
from pipeline.simulate.specs import PolicySpec
from pipeline.simulate.workload import make_workload

TUNE_ROWS = (16, 32, 64, 128, 256, 512)
TUNE_DELAYS_MS = (0.5, 1.0, 2.0, 5.0, 10.0)
TUNE_REQUESTS = 10_000


def tune_static(
    curve: Curve,
    *,
    rows: RowsDist | str = DEFAULT_ROWS,
    seed: int = 1,
    duration: float | None = None,
    load: float = 0.5,
    cfg: SimConfig | None = None,
    grid_rows: Sequence[int] = TUNE_ROWS,
    grid_delays_ms: Sequence[float] = TUNE_DELAYS_MS,
) -> tuple[tuple[int, float], list[tuple[int, float, float]]]:
    """The static config (rows, linger s) with the lowest p99 at `load` on Poisson
    arrivals, by grid search. The grid keeps a positive linger: with a linger of zero
    static is greedy with a row cap, already in every comparison. Default duration:
    5 s, or less on fast curves (about TUNE_REQUESTS requests per configuration)."""
    if isinstance(rows, str):
        rows = RowsDist.parse(rows)
    if duration is None:
        duration = min(5.0, TUNE_REQUESTS * rows.mean / (load * curve.capacity))
    workload = make_workload("poisson", curve, load=load, duration=duration, rows=rows, seed=seed)
    table: list[tuple[int, float, float]] = []
    best: tuple[float, int, float] | None = None
    for r in grid_rows:
        if r > curve.max_batch_rows:
            continue
        for d_ms in grid_delays_ms:
            spec = PolicySpec(f"static:{r}:{d_ms:g}", "static", {"max_batch_rows": r, "max_queue_delay": d_ms / 1e3}, {})
            res = simulate(workload, curve, spec, cfg)
            table.append((r, d_ms, res.p99_ms))
            key = (res.p99_ms, -r, d_ms)
            if best is None or key < (best[0], -best[1], best[2]):
                best = (res.p99_ms, r, d_ms)
    assert best is not None
    return (best[1], best[2] / 1e3), table

