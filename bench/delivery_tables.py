"""bench/delivery.py's output: a line per run as it is measured, the table of the
figures and the table of ratios exactly_once / at_least_once.
"""

from __future__ import annotations

from bench.delivery_cells import TARGET, Mode
from bench.harness import cpu_text, stages_text, table


def sat_line(mode: Mode, r: dict) -> None:
    flag = "  NO TRANSACTION MARKERS: the worker did not use transactions" if r["no_transactions"] else ""
    print(f"saturation, {mode.label}: {r['requests_per_s']:.0f} req/s readable "
          f"({r['produced_requests_per_s']:.0f} produced, last commit +{r['final_commit_wait_ms']:.0f} ms, "
          f"{r['txn_markers']} markers{_txn_text(r)}); {cpu_text(r['cpu_cores'])}{flag}", flush=True)


def lat_line(mode: Mode, rate: float, r: dict) -> None:
    if "p50_ms" not in r:
        print(f"latency, {mode.label}: NO RESULTS read of {r['sent']}", flush=True)
        return
    print(f"latency, {mode.label} @ {rate:.0f} req/s: p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} ms as read "
          f"(result timestamps: {r['p50_produced_ms']:.1f} / {r['p99_produced_ms']:.1f}); "
          f"dup {r['duplicates']} missing {r['missing']}{_txn_text(r)}; {cpu_text(r['cpu_cores'])}; "
          f"{stages_text(r['stages'])}", flush=True)


def _txn_text(r: dict) -> str:
    t = r.get("transactions") or {}
    if not t:
        return ""
    return (f"; {t['commits']:.0f} commits (one per {t['commit_period_ms']:.0f} ms), mean {t['mean_commit_ms']:.1f} ms, "
            f"{t['aborted']:.0f} aborted")


def _periods(sat: dict, lat: dict) -> str:
    """Mean time between the worker's commits: during the drain / at the latency load."""
    cells = [f"{r['transactions']['commit_period_ms']:.0f}" if r.get("transactions") else "-" for r in (sat, lat)]
    return "-" if cells == ["-", "-"] else " / ".join(cells)


def _spread(values: list[float], fmt: str = "{:.0f}") -> str:
    return f" ({fmt.format(min(values))}-{fmt.format(max(values))})" if len(values) > 1 else ""


def figures_table(report: dict) -> str:
    rows = []
    for label, s in report["saturation"].items():
        lat = report.get("latency", {}).get(label, {})
        cores = lat.get("cpu_cores") or {**s["cpu_cores"], "reader": float("nan")}
        rows.append([
            label + (" (NO TRANSACTIONS SEEN)" if s.get("no_transactions") else ""),
            f"{s['requests_per_s']:.0f}" + _spread(s["runs_requests_per_s"]) + _marks(s),
            f"{s['produced_requests_per_s']:.0f}",
            f"{s['final_commit_wait_ms']:.0f}",
            f"{s['txn_markers']}",
            f"{s['transactions']['mean_commit_ms']:.1f}" if s.get("transactions") else "-",
            _periods(s, lat),
            f"{lat['p50_ms']:.1f}" + _spread(lat["runs_p50_ms"]) + _marks(lat) if "p50_ms" in lat else "-",
            f"{lat['p99_ms']:.1f}" + _spread(lat["runs_p99_ms"]) if "p99_ms" in lat else "-",
            f"{lat['p50_produced_ms']:.1f} / {lat['p99_produced_ms']:.1f}" if "p50_ms" in lat else "-",
            f"{lat['p50_wait_ms']:.1f} / {lat['p99_wait_ms']:.1f}" if "p50_ms" in lat else "-",
            f"{lat['duplicates_all_runs']} / {lat['missing_all_runs']} of {lat['sent_all_runs']}" if lat else "-",
            " / ".join(f"{cores.get(k, float('nan')):.2f}" for k in ("generator", "worker", "broker", "reader", "others")),
        ])
    return table(["mode", "sat req/s", "produced req/s", "final commit wait ms", "txn markers", "mean commit ms",
                  "commit every ms: sat / lat", "p50 ms", "p99 ms", "ts-based p50/p99", "read-ts p50/p99",
                  "dup / missing (all runs)", "cores at latency load: gen / worker / broker / reader / others"], rows)


def _marks(cell: dict) -> str:
    n, redone = cell.get("disturbed_runs", 0), len(cell.get("redone_runs", []))
    parts = ([f"{n} disturbed"] if n else []) + ([f"{redone} redone"] if redone else [])
    return f" [{', '.join(parts)}]" if parts else ""


def ratio_table(report: dict) -> str:
    rows = [[r["mode"], f"{r['saturation']:.2f}", f"{r['saturation_produced']:.2f}",
             f"{r['p50']:.2f}" if "p50" in r else "-", f"{r['p99']:.2f}" if "p99" in r else "-",
             f"+{r['wait_p50_added_ms']:.0f} / +{r['wait_p99_added_ms']:.0f}" if "wait_p50_added_ms" in r else "-",
             "yes" if r["meets_target"] else "NO"] for r in report["ratios"]]
    return table(["exactly_once / at_least_once", "saturation", "sat. (produced)", "p50", "p99",
                  "read-ts wait added, p50 / p99 ms", f">= {TARGET:.0%} target"], rows)
