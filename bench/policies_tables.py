"""bench/policies.py's output: the tables of one broker's report, the side-by-side table
of two brokers', and the plot (latency and SLO misses by load, goodput under overload).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.harness import table
from bench.policies_scenario import SLO_MS


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _cell(r: dict) -> str:
    return f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ({100 * r['slo_miss_rate']:.0f}%)"


def side_by_side(reports: dict[str, dict], policies: list[str], loads: list[float], over_policies: list[str]) -> str:
    """One row per policy and load, one column per broker: p50 / p99 ms (SLO-miss %);
    then goodput under overload, and the cores each process used at 50 % load."""
    engines = list(reports)
    rows = [["capacity, req/s: drained / live", *(f"{reports[e]['drained_capacity_req_s']:.0f} / {reports[e]['live_capacity_req_s']:.0f}"
                                                 for e in engines)],
            ["loads are of", *(reports[e]["load_basis"] for e in engines)]]
    for p in policies:
        for k in [str(x) for x in loads] + ["onoff"]:
            what = "on/off bursts" if k == "onoff" else f"{100 * float(k):.0f}%"
            rows.append([f"{p}, {what}", *(_cell(reports[e]["steady"][p][k]) for e in engines)])
    for p in over_policies:
        rows.append([f"{p}, burst / 120% goodput (x capacity)",
                     *(f"{reports[e]['overload'][p]['burst']['burst_goodput_x_capacity']:.2f} / "
                       f"{reports[e]['overload'][p]['overload']['goodput_x_capacity']:.2f}" for e in engines)])
    for p in policies:
        rows.append([f"{p}, 50%: stage p99 ms to_worker / decode / queue / model / publish",
                     *(" / ".join(_ms(reports[e]["steady"][p]["0.5"]["stages"][k]["p99_ms"])
                                 for k in ("to_worker", "decode", "queue", "model", "publish")) for e in engines)])
    for p in policies:
        rows.append([f"{p}, 50%: cores generator / worker / broker",
                     *("{generator:.2f} / {worker:.2f} / {broker:.2f}".format(**reports[e]["steady"][p]["0.5"]["cpu_cores"])
                       for e in engines)])
    return table(["case", *engines], rows)


def print_tables(report: dict, policies: list[str], loads: list[float], over_policies: list[str]) -> None:
    cap = report["capacity_req_s"]
    print(f"\ncapacity: drained {report['drained_capacity_req_s']:.0f} req/s, live {report['live_capacity_req_s']:.0f} req/s; "
          f"loads are of the {report['load_basis']} one")
    print(f"capacity {cap:.0f} req/s ({report['capacity_rows_s']:.0f} rows/s); SLO {SLO_MS:.0f} ms; "
          f"static-tuned = {report['static_tuned']}")
    rows = []
    for p in policies:  # empty with --overload-only
        row = [p]
        for k in [str(x) for x in loads] + ["onoff"]:
            r = report["steady"][p][k]
            row.append(f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ({100 * r['slo_miss_rate']:.0f}%)")
        rows.append(row)
    if rows:
        print("\np50 / p99 ms (SLO-miss %) by load")
        print(table(["policy", "10%", "50%", "90%", "on/off bursts"], rows))
    rows = []
    for p in over_policies:
        b, o, pr = (report["overload"][p][k] for k in ("burst", "overload", "priorities"))
        rows.append([
            p, f"{b['burst_goodput_x_capacity']:.2f}", f"{b['recovery_s']:.1f}",
            f"{o['goodput_x_capacity']:.2f}", f"{pr['high_p99_ms']:.0f}", f"{pr['low_p99_ms']:.0f}",
            "yes" if all(x["outcomes_add_up"] for x in (b, o, pr)) else "NO",
        ])
    print("\noverload scenarios (goodput = answers within SLO per second, x capacity)")
    print(table(["policy", "burst goodput", "recovery s", "120% goodput", "hi-prio p99 @110%",
                 "lo-prio p99", "outcomes add up"], rows))


def plot(report: dict, policies: list[str], loads: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    xs = [100 * x for x in loads]
    for p in policies:
        (line,) = axes[0].plot(xs, [report["steady"][p][str(x)]["p99_ms"] for x in loads], marker="o", label=p)
        axes[0].plot(xs, [report["steady"][p][str(x)]["p50_ms"] for x in loads], ls=":", color=line.get_color())
        axes[1].plot(xs, [100 * report["steady"][p][str(x)]["slo_miss_rate"] for x in loads], marker="o",
                     color=line.get_color(), label=p)
    axes[0].axhline(SLO_MS, color="k", ls="--", lw=0.8, label="SLO")
    axes[0].set(yscale="log", xlabel="load (% of capacity)", ylabel="latency of scored requests, ms",
                title="latency: p99 (solid), p50 (dotted)")
    axes[0].legend(fontsize=7)
    axes[1].set(xlabel="load (% of capacity)", ylabel="% of requests not answered within SLO",
                title="SLO misses (scored late or routed late)")
    axes[1].legend(fontsize=7)
    over = report["overload"]
    names = list(over)
    x = np.arange(len(names))
    axes[2].bar(x - 0.2, [over[n]["burst"]["burst_goodput_x_capacity"] for n in names], 0.4, label="burst 150%")
    axes[2].bar(x + 0.2, [over[n]["overload"]["goodput_x_capacity"] for n in names], 0.4, label="sustained 120%")
    axes[2].set_xticks(x, names, fontsize=8)
    axes[2].set(ylabel="goodput (x capacity)", title="goodput under overload")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
