"""Latency curves for the simulator: a model's cost per call t(n) = a + b·n, its batch
limit and SLO budgets, read from a shipped curve (pipeline/curves/NAME.json), a JSON
file (also `tidebatch profile`'s, pipeline/profiling/fit.py) or inline ab:A_MS:B_MS."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import UserError

CURVES_DIR = Path(__file__).parent.parent / "curves"


@dataclass(frozen=True)
class Curve:
    """A model's cost per call, t(n) = a + b·n seconds, with its batching limit and the
    SLO budget of each priority level."""

    name: str
    a: float  # seconds per call
    b: float  # seconds per row
    max_batch_rows: int
    slo: dict[int, float]  # priority -> budget, seconds
    source: str = ""

    def service(self, rows: int) -> float:
        return self.a + self.b * rows

    @property
    def capacity(self) -> float:
        """Rows/s with full batches back to back."""
        return self.max_batch_rows / self.service(self.max_batch_rows)

    def budget(self, priority: int) -> float:
        """SLO budget of a priority level; an undeclared level gets the loosest one."""
        return self.slo.get(priority, self.slo[max(self.slo)])


def _fit_points(points: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Least-squares a, b (ms) through measured (rows, ms) points."""
    if len(points) < 2:
        raise UserError("a measured curve needs at least two (rows, ms) points")
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise UserError("a measured curve needs points at two different batch sizes")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return max(my - b * mx, 0.0), max(b, 1e-9)


def curve_from_dict(d: dict, name: str = "curve") -> Curve:
    try:
        if "points" in d:
            a_ms, b_ms = _fit_points(d["points"])
        else:
            a_ms, b_ms = float(d["a_ms"]), float(d["b_ms_per_row"])
        slo = {int(k): float(v) / 1e3 for k, v in d.get("slo_ms", {"0": 100}).items()}
        return Curve(
            name=str(d.get("name", name)),
            a=a_ms / 1e3,
            b=b_ms / 1e3,
            max_batch_rows=int(d.get("max_batch_rows", 512)),
            slo=slo,
            source=str(d.get("source", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"curve {name!r}: bad or missing field ({exc})") from None


def load_curve(spec: str) -> Curve:
    """A shipped curve by name (pipeline/curves/NAME.json), a JSON file path, or
    ab:A_MS:B_MS[:MAX_ROWS[:SLO_MS]] inline."""
    if spec.startswith("ab:"):
        parts = spec.split(":")[1:]
        try:
            a_ms, b_ms = float(parts[0]), float(parts[1])
            max_rows = int(parts[2]) if len(parts) > 2 else 512
            slo_ms = float(parts[3]) if len(parts) > 3 else 100.0
        except (IndexError, ValueError):
            raise UserError(f"bad curve {spec!r}; expected ab:A_MS:B_MS[:MAX_ROWS[:SLO_MS]]") from None
        return curve_from_dict(
            {"name": spec, "a_ms": a_ms, "b_ms_per_row": b_ms, "max_batch_rows": max_rows,
             "slo_ms": {"0": slo_ms, "1": 2 * slo_ms}},
            spec,
        )
    name, data = read_curve_file(spec, "batch")
    return curve_from_dict(data, name)


# A curve file's "kind": "batch" (t(n) = a + b·n per call, the default when absent) or
# "generation" (a decoder's per-step cost, pipeline/generation/cost.py).
CURVE_KINDS = ("batch", "generation")


def read_curve_file(spec: str, kind: str) -> tuple[str, dict]:
    """The name and JSON of a curve: a shipped one by name (pipeline/curves/NAME.json)
    or a file path; refused with one line when it is not of `kind`."""
    path = Path(spec)
    if not path.exists():
        path = CURVES_DIR / f"{spec}.json"
    if not path.exists():
        names = ", ".join(sorted(p.stem for p in CURVES_DIR.glob("*.json")))
        raise UserError(f"unknown curve {spec!r}; shipped curves: {names}; or a JSON file, or ab:A_MS:B_MS")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"curve file {path}: not valid JSON ({exc})") from None
    found = data.get("kind", "batch") if isinstance(data, dict) else None
    if found != kind:
        hint = "tidebatch simulate --workload generate" if found == "generation" else "tidebatch simulate"
        raise UserError(f"curve {spec!r} is a {found!r} curve, not a {kind!r} one (use it with {hint})")
    return path.stem, data

