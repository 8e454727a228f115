"""The simulator's comparison as a fixed-width table (`tidebatch simulate`)."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.simulate.results import RunResult


def format_table(results: Sequence[RunResult]) -> str:
    """A fixed-width table; extra columns appear when a scenario has them."""
    has_burst = any(r.burst_goodput_rows_s is not None for r in results)
    has_prio = any(len(r.p99_by_priority_ms) > 1 for r in results)
    head = ["policy", "load", "p50ms", "p99ms", "p99.9ms", "thru/cap", "good/cap",
            "batch", "miss%", "in_time", "late", "routed", "busy%"]
    if has_burst:
        head += ["burst_good/cap", "recovery_s"]
    if has_prio:
        head += ["p99_hi_ms", "p99_lo_ms"]
    rows = []
    for r in results:
        row = [
            r.policy,
            "-" if r.load is None else f"{r.load:g}",
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.p999_ms:.1f}",
            f"{r.throughput_rows_s / r.capacity_rows_s:.3f}",
            f"{r.goodput_share:.3f}",
            f"{r.mean_batch_rows:.0f}",
            f"{100 * r.slo_miss_rate:.2f}",
            str(r.outcomes["in_time"]),
            str(r.outcomes["scored_late"]),
            str(r.outcomes["routed_late"]),
            f"{100 * r.utilization:.0f}",
        ]
        if has_burst:
            if r.burst_goodput_rows_s is None:
                row += ["-", "-"]
            else:
                rec = f"{'>=' if r.recovery_censored else ''}{r.recovery_s:.1f}"
                row += [f"{r.burst_goodput_rows_s / r.capacity_rows_s:.3f}", rec]
        if has_prio:
            pr = r.p99_by_priority_ms
            row += [f"{pr.get(0, float('nan')):.1f}", f"{pr.get(1, float('nan')):.1f}"]
        rows.append(row)
    widths = [max(len(h), *(len(x[i]) for x in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(wd) if i else h.ljust(wd) for i, (h, wd) in enumerate(zip(head, widths, strict=True)))]
    for row in rows:
        lines.append("  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)

