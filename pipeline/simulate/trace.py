"""A recorded arrival trace for the simulator (`--scenario trace:FILE`): CSV or JSONL,
one request per record. bench/calibration.py writes them from a real run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from pipeline.errors import UserError
from pipeline.simulate.arrivals import Arrival


def read_trace(path: str) -> list[Arrival]:
    """A recorded trace: CSV with a header, or JSONL; fields time (s), rows, and
    optionally priority and deadline (absolute seconds on the trace's clock). Times are
    shifted so the first arrival is at 0 (a trace may carry epoch timestamps)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"trace file {path} not found")
    records: list[dict] = []
    try:
        if p.suffix in (".jsonl", ".json", ".ndjson"):
            for line in p.read_text().splitlines():
                if line.strip():
                    records.append(json.loads(line))
        else:
            with p.open(newline="") as fh:
                records = list(csv.DictReader(fh))
        out = []
        for r in records:
            t = float(r.get("time", r.get("t")))  # type: ignore[arg-type]
            deadline = r.get("deadline")
            out.append(
                Arrival(
                    t,
                    max(1, int(float(r.get("rows", 1)))),
                    int(float(r.get("priority") or 0)),
                    float(deadline) if deadline not in (None, "") else None,
                )
            )
    except (TypeError, ValueError, json.JSONDecodeError) as exc:
        raise UserError(f"trace file {path}: bad record ({exc}); need time, rows[, priority, deadline]") from None
    out.sort(key=lambda a: a.t)
    if out and out[0].t != 0.0:
        t0 = out[0].t
        out = [Arrival(a.t - t0, a.rows, a.priority, None if a.deadline is None else a.deadline - t0) for a in out]
    return out

