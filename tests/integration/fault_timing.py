"""The latency figures of a fault run (tests/integration/test_cluster_faults.py and
test_network_faults.py): from (result record timestamp, end-to-end latency) pairs in
ms, the p99 before the fault, the recovery time against an SLO, the longest gap
between results and the p99 per second around the fault. Reported, never asserted."""

from __future__ import annotations

WINDOW_MS = 1000  # the sliding window of recovery_ms
STEP_MS = 100  # and its step


def p99(values: list[int]) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))])


def recovery_ms(results: list[tuple[int, int]], fault_ms: int, slo_ms: float) -> int:
    """ms from the fault to the end of the last 1 s window (sliding by 100 ms, over
    result record timestamps) whose p99 latency is over `slo_ms`; 0 if none is."""
    results = sorted(results)
    if not results:
        return 0
    end = results[-1][0]
    last_bad = None
    t = fault_ms
    lo = 0
    while t <= end:
        while lo < len(results) and results[lo][0] <= t - WINDOW_MS:
            lo += 1
        window = [lat for ts, lat in results[lo:] if ts <= t]
        if window and p99(window) > slo_ms:
            last_bad = t
        t += STEP_MS
    return 0 if last_bad is None else last_bad - fault_ms


def baseline_p99(results: list[tuple[int, int]], fault_ms: int) -> float | None:
    """p99 latency over the 3 s before the fault: what "recovered" returns to."""
    base = [lat for ts, lat in results if fault_ms - 3000 <= ts < fault_ms]
    return p99(base) if base else None


def longest_gap_ms(results: list[tuple[int, int]]) -> int:
    """The longest time between two consecutive result records (record timestamps):
    how long nothing came out."""
    stamps = sorted(ts for ts, _ in results)
    return max((b - a for a, b in zip(stamps, stamps[1:], strict=False)), default=0)


def timeline(results: list[tuple[int, int]], fault_ms: int) -> dict[int, float]:
    """p99 latency per whole second of result time, relative to the fault."""
    buckets: dict[int, list[int]] = {}
    for ts, lat in results:
        buckets.setdefault((ts - fault_ms) // 1000, []).append(lat)
    return {sec: p99(lats) for sec, lats in sorted(buckets.items())}
