"""The tables, the CSV and the plot of bench/peers.py's merged results (docs/PEERS.md
shows them): medians of the drains, live latency and goodput per load."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from bench.harness import table
from bench.peers.launch import PEERS


def json_drain_medians(results: dict) -> dict[str, float]:
    """"row:json" → its median drain in requests/s, for the rows drained so far: the
    capacities the live loads and the burst (bench/peers_burst.py) are fractions of."""
    return {key: statistics.median(r["requests_per_s"] for r in runs) for key, runs in results["drain"].items()
            if key.endswith(":json")}


def drain_rows(results: dict) -> list[dict]:
    """One dict per drained row (peer, encoding): the median run by rows/s, with the
    range, as shares of the best model peak of the run."""
    peak = max((p["rows_per_s"] for p in results.get("model_peak", [])), default=float("nan"))
    out = []
    for key, runs in results.get("drain", {}).items():
        name, enc = key.split(":")
        by_rate = sorted(runs, key=lambda r: r["rows_per_s"])
        med = by_rate[(len(by_rate) - 1) // 2]
        out.append({
            "row": name, "encoding": enc, "label": PEERS[name].label if name in PEERS else name,
            "rounds": len(runs), "rows_per_s": med["rows_per_s"], "requests_per_s": med["requests_per_s"],
            "rows_per_s_range": f"{by_rate[0]['rows_per_s'] / 1e3:.1f}-{by_rate[-1]['rows_per_s'] / 1e3:.1f}k",
            "of_peak": med["rows_per_s"] / peak,
            "worker_cpu_s_per_10k": statistics.median(r["worker_cpu_s_per_10k"] for r in runs),
            "broker_cpu_s_per_10k": statistics.median(r["broker_cpu_s_per_10k"] for r in runs),
            "mean_batch_rows": med["mean_batch_rows"],
            "correct": all(r["correct"] for r in runs),
            "max_abs_diff": max(r["max_abs_diff"] for r in runs),
            "duplicates": sum(r["duplicates"] for r in runs),
        })
    return sorted(out, key=lambda r: (r["encoding"], -r["rows_per_s"]))


def _ms(v: float) -> str:
    return "never" if math.isinf(v) else f"{v:.0f}"


def text(results: dict) -> str:
    peaks = ", ".join(f"{p['rows_per_s'] / 1e3:.0f}k" for p in results.get("model_peak", []))
    lines = [f"commit {results.get('commit')}, broker {results.get('broker')}; model direct peak (rows/s, "
             f"each drain invocation): {peaks}"]
    rows = [[r["label"], r["encoding"], f"{r['rows_per_s'] / 1e3:.1f}k ({r['rows_per_s_range']})",
             f"{r['requests_per_s']:.0f}", f"{100 * r['of_peak']:.0f}%", f"{r['worker_cpu_s_per_10k']:.1f}",
             f"{r['broker_cpu_s_per_10k']:.1f}", f"{r['mean_batch_rows']:.0f}",
             ("yes" if r["correct"] else "NO") + f" ({r['max_abs_diff']:.0e}), {r['duplicates']} dup", r["rounds"]]
            for r in drain_rows(results)]
    lines.append(table(["row", "requests", "rows/s (range)", "req/s", "of peak", "worker cpu-s/10k",
                        "broker cpu-s/10k", "batch rows", "all scored (max diff), duplicates", "rounds"], rows))
    for name, why in results.get("skipped", {}).items():
        lines.append(f"{name}: skipped ({why})")
    for key, why in results.get("failed", {}).items():
        lines.append(f"{key}: failed ({why})")
    live = results.get("live", {})
    if live:
        labels = list(results.get("live_rates", {}))
        lines.append("\nlive, JSON requests: p50 / p99 ms, goodput req/s within 100 ms (% in SLO); "
                     + ", ".join(f"{k} = {v:.0f} req/s" for k, v in results.get("live_rates", {}).items()))
        rows = []
        for name, per in live.items():
            rows.append([name, *(f"{_ms(per[k]['p50_ms'])} / {_ms(per[k]['p99_ms'])}, {per[k]['goodput_req_s']:.0f} "
                                 f"({100 * per[k]['in_slo']:.0f}%)" if k in per else "-" for k in labels)])
        lines.append(table(["row", *labels], rows))
        gen = [r["cpu_cores"].get("generator", float("nan")) for per in live.values() for r in per.values()]
        lines.append(f"generator (the bench process) used {min(gen):.2f}-{max(gen):.2f} cores during the live runs")
    return "\n".join(lines)


def markdown(results: dict) -> str:
    """The drain table as docs/PEERS.md shows it."""
    lines = ["| row | requests | rows/s (range) | req/s | of peak | worker CPU-s / 10k | broker CPU-s / 10k "
             "| batch rows | all scored (max diff), duplicates | rounds |", "|---" * 10 + "|"]
    for r in drain_rows(results):
        lines.append(f"| {r['label']} | {r['encoding']} | {r['rows_per_s'] / 1e3:.1f}k ({r['rows_per_s_range']}) "
                     f"| {r['requests_per_s']:.0f} | {100 * r['of_peak']:.0f} % | {r['worker_cpu_s_per_10k']:.1f} "
                     f"| {r['broker_cpu_s_per_10k']:.1f} | {r['mean_batch_rows']:.0f} "
                     f"| {'yes' if r['correct'] else '**no**'} ({r['max_abs_diff']:.1e}), {r['duplicates']} "
                     f"| {r['rounds']} |")
    return "\n".join(lines)


def write(results: dict, stem: Path) -> None:
    """stem.csv (the drain table) and stem.png (throughput, CPU per request, live p99)."""
    rows = drain_rows(results)
    with open(stem.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["row"])
        w.writeheader()
        w.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = results.get("live", {})
    fig, axes = plt.subplots(1, 3 if live else 2, figsize=(17 if live else 12, 5))
    names = [f"{r['row']} ({r['encoding']})" for r in rows]
    colors = ["tab:orange" if r["row"].startswith("tidebatch") else "tab:blue" for r in rows]
    axes[0].barh(names, [100 * r["of_peak"] for r in rows], color=colors)
    axes[0].set(xlabel="drain throughput, % of the model's direct peak", title="backlog drain (median)")
    axes[0].invert_yaxis()
    axes[1].barh(names, [r["worker_cpu_s_per_10k"] for r in rows], color=colors, label="peer process")
    axes[1].barh(names, [r["broker_cpu_s_per_10k"] for r in rows], left=[r["worker_cpu_s_per_10k"] for r in rows],
                 color="tab:gray", label="broker")
    axes[1].set(xlabel="CPU-seconds per 10k requests", title="CPU during the drain")
    axes[1].invert_yaxis()
    axes[1].legend(fontsize=8)
    axes[1].tick_params(labelleft=False)
    if live:
        rates = results.get("live_rates", {})
        order = sorted(rates, key=rates.get)  # type: ignore[arg-type]
        for name, per in live.items():
            xs = [rates[k] for k in order if k in per]
            ys = [min(per[k]["p99_ms"], 1e5) for k in order if k in per]
            axes[2].plot(xs, ys, marker="o", label=name, lw=2.5 if name.startswith("tidebatch") else 1)
        axes[2].axhline(100, color="k", ls="--", lw=0.8, label="SLO")
        axes[2].set(xscale="log", yscale="log", xlabel="offered load, req/s",
                    ylabel="p99 end to end, ms (never answered: top)", title="live load, JSON requests")
        axes[2].legend(fontsize=7)
    fig.suptitle(f"tidebatch and its peers, one run: commit {results.get('commit')}, broker {results.get('broker')}")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=100)
