"""The arithmetic of bench/delivery.py, no broker and no timing (its unit test is
tests/unit/test_bench_delivery.py): the delivery modes, when a drain ends for a
read_committed reader, latency percentiles, medians over a cell's runs, the ratios
exactly_once / at_least_once, and which runs other work on the machine disturbed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.pipeline_capacity import STATIC_ENV

ALO = "at_least_once"
EOS = "exactly_once"
TARGET = 0.8  # issue 18: exactly-once saturation >= 80 % of at-least-once's
# A run during which processes other than the bench's own used this many cores (or the
# hypervisor stole them) shared the machine: flagged, since on two cores its figures
# say more about the neighbour than about the delivery mode.
DISTURBED_CORES = 0.25


def disturbed(run: dict) -> bool:
    cores = run.get("cpu_cores", {})
    return cores.get("others", 0.0) + cores.get("stolen", 0.0) > DISTURBED_CORES


@dataclass(frozen=True)
class Mode:
    label: str  # "at_least_once", "exactly_once 100 ms"
    delivery: str
    interval_ms: int | None = None

    def env(self) -> dict[str, str]:
        env = {"TIDEBATCH_DELIVERY": self.delivery}
        if self.interval_ms is not None:
            env["TIDEBATCH_TRANSACTION_INTERVAL_MS"] = str(self.interval_ms)
        return env

    @property
    def tag(self) -> str:
        """Topic and log name part: alo, eos20, eos100, ..."""
        return "alo" if self.delivery == ALO else f"eos{self.interval_ms}"


def modes(intervals: list[int]) -> list[Mode]:
    return [Mode(ALO, ALO), *(Mode(f"{EOS} {ms} ms", EOS, ms) for ms in intervals)]


def policy_env(policy: str, backlog: bool) -> dict[str, str]:
    """The worker's batching settings: pipeline_capacity's static reference (1024 rows,
    10 ms), or another policy as configured. A preloaded backlog is older than any SLO,
    so a backlog drain lifts it (as bench/policies.py does)."""
    if policy == "static":
        return dict(STATIC_ENV)
    return {"TIDEBATCH_BATCHING__SLO_MS": "3600000"} if backlog else {}


def drain_rates(n: int, rows: int, first_ts_ms: float, last_ts_ms: float, committed_ms: float | None,
                delivery: str) -> dict:
    """A drain's rates. `readable` ends when the last result can be read by a
    read_committed reader: the last result's timestamp under at-least-once (no
    transaction), the observed commit of the last transaction under exactly-once (never
    before the last result's own timestamp). `produced` ends at the last result's
    timestamp in both modes."""
    produced_s = max(last_ts_ms - first_ts_ms, 1.0) / 1000.0
    end_ms = last_ts_ms
    if delivery == EOS:
        if committed_ms is None:
            raise ValueError("an exactly_once drain needs the time its last transaction committed")
        end_ms = max(last_ts_ms, committed_ms)
    readable_s = max(end_ms - first_ts_ms, 1.0) / 1000.0
    return {
        "requests_per_s": n / readable_s, "rows_per_s": rows / readable_s,
        "produced_requests_per_s": n / produced_s, "produced_rows_per_s": rows / produced_s,
        "drain_s": readable_s, "final_commit_wait_ms": end_ms - last_ts_ms,
    }


def latency_summary(read_ms: list[float], produced_ms: list[float], sent: int, duplicates: int) -> dict:
    """Percentiles of the latency as read (primary) and as the result timestamps say."""
    read, produced = np.asarray(read_ms, dtype=float), np.asarray(produced_ms, dtype=float)
    if not len(read):
        return {"sent": sent, "results": 0, "missing": sent, "duplicates": duplicates}
    return {
        "sent": sent, "results": len(read), "missing": sent - len(read), "duplicates": duplicates,
        "p50_ms": float(np.percentile(read, 50)), "p99_ms": float(np.percentile(read, 99)),
        "p50_produced_ms": float(np.percentile(produced, 50)), "p99_produced_ms": float(np.percentile(produced, 99)),
        "mean_commit_wait_ms": float(np.mean(read - produced)),
        "p50_wait_ms": float(np.percentile(read - produced, 50)), "p99_wait_ms": float(np.percentile(read - produced, 99)),
    }


def summarise(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """Over the runs of one cell: the median of each of `keys` (the mean of the middle
    two for an even count), every run's value as runs_<key>, and the other fields of
    the run nearest the median of the first key."""
    med = {k: float(np.median([r[k] for r in runs])) for k in keys}
    nearest = min(runs, key=lambda r: abs(r[keys[0]] - med[keys[0]]))
    return {**nearest, **med, **{f"runs_{k}": [r[k] for r in runs] for k in keys}}


SAT_KEYS = ("requests_per_s", "produced_requests_per_s", "rows_per_s", "produced_rows_per_s", "final_commit_wait_ms")
LAT_KEYS = ("p99_ms", "p50_ms", "p50_produced_ms", "p99_produced_ms", "mean_commit_wait_ms", "p50_wait_ms",
            "p99_wait_ms")


def ratios(report: dict) -> list[dict]:
    """exactly_once / at_least_once for every exactly-once mode: saturation (readable and
    produced) and latency p50 / p99 (as read)."""
    sat, lat = report["saturation"], report.get("latency", {})
    base_s, base_l = sat[ALO], lat.get(ALO)
    rows = []
    for label, s in sat.items():
        if label == ALO:
            continue
        row = {"mode": label,
               "saturation": s["requests_per_s"] / base_s["requests_per_s"],
               "saturation_produced": s["produced_requests_per_s"] / base_s["produced_requests_per_s"]}
        if base_l and label in lat and "p50_ms" in lat[label]:
            row["p50"] = lat[label]["p50_ms"] / base_l["p50_ms"]
            row["p99"] = lat[label]["p99_ms"] / base_l["p99_ms"]
            if "p50_wait_ms" in base_l:  # ms a result waits longer, once produced, to be readable
                row["wait_p50_added_ms"] = lat[label]["p50_wait_ms"] - base_l["p50_wait_ms"]
                row["wait_p99_added_ms"] = lat[label]["p99_wait_ms"] - base_l["p99_wait_ms"]
        row["meets_target"] = row["saturation"] >= TARGET
        rows.append(row)
    return rows


def undisturbed(measure, describe, retries: int, redone: list[dict]) -> dict:
    """measure() again, up to `retries` times, while other work on the machine disturbed
    it; the last run is kept (marked if still disturbed), the others go to `redone`."""
    for attempt in range(retries + 1):
        r = measure()
        describe(r)
        if not disturbed(r) or attempt == retries:
            return r
        print(f"  disturbed (others {r['cpu_cores'].get('others', 0):.2f}, stolen "
              f"{r['cpu_cores'].get('stolen', 0):.2f} cores): measured again", flush=True)
        redone.append(r)
    raise AssertionError("unreachable")
