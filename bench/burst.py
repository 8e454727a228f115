"""Burst, overload and steady rows of bench/policies.py for a few policies, repeated
and interleaved, optionally against a baseline checkout (issue 26, item 4), in one run
on one broker:

    .venv/bin/python bench/burst.py --capacity 700 --policies greedy,adaptive \\
        --scenarios burst,overload --repeat 1 [--baseline /tmp/tidebatch-before]

--capacity is 100 % load in req/s (the live capacity of bench/policies.py; this bench
does not measure it, so that each invocation fits a few minutes). --baseline DIR runs
the same rows with workers started from DIR (a checkout of another commit), each row
right after this tree's, so the two are compared under the same machine load. Every
row prints the cores of the generator (this process), the worker, the broker and the
rest of the machine meanwhile. Appends each row to out/bench/burst.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import harness  # noqa: E402
from bench.harness import OUT, RequestPool, cpu_text, local_broker, stages_text  # noqa: E402
from bench.policies import run_scenario, window_goodput  # noqa: E402

PRE, BURST, POST = 3.0, 6.0, 6.0
STEADY_SECONDS = 6.0


@contextmanager
def workers_from(repo: Path | None):
    """Start the workers of the block from `repo` (None: this tree)."""
    if repo is None:
        yield
        return
    saved = harness.REPO
    harness.REPO = repo
    try:
        yield
    finally:
        harness.REPO = saved


def row(bs: str, pool: RequestPool, policy: str, scenario: str, capacity: float, repo: Path | None) -> dict:
    env = {"PYTHONPATH": str(repo)} if repo is not None else {}
    with workers_from(repo):
        if scenario == "burst":
            def rate(t: float) -> float:
                return (1.5 if PRE <= t < PRE + BURST else 0.5) * capacity

            r = run_scenario(bs, pool, policy, rate, PRE + BURST + POST, extra_env=env, machine=True)
            r["goodput_x_capacity"] = window_goodput(r, PRE, PRE + BURST) / capacity
        elif scenario == "overload":
            r = run_scenario(bs, pool, policy, 1.2 * capacity, STEADY_SECONDS, extra_env=env, machine=True)
            r["goodput_x_capacity"] = window_goodput(r, 2.0, STEADY_SECONDS) / capacity
        else:  # steady:FRACTION
            load = float(scenario.split(":", 1)[1])
            r = run_scenario(bs, pool, policy, load * capacity, STEADY_SECONDS, extra_env=env, machine=True)
            r["goodput_x_capacity"] = window_goodput(r, 0.0, STEADY_SECONDS) / capacity
    return {k: v for k, v in r.items() if not k.startswith("_")}


def summary(path: Path, since: float = 0.0) -> str:
    """The rows of burst.jsonl since a time, by scenario, policy and tree: runs,
    goodput (x capacity) median and range, p99 range, and the cores of the generator and
    of the rest of the machine over those runs."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r["at"] >= since:
            groups.setdefault((r["scenario"], r["policy"], r["tree"]), []).append(r)
    rows = []
    for (scenario, policy, tree), rs in sorted(groups.items()):
        good = sorted(r["goodput_x_capacity"] for r in rs)
        p99 = [r["p99_ms"] for r in rs]
        gen = [r["cpu_cores"]["generator"] for r in rs]
        others = [r["cpu_cores"].get("others", float("nan")) for r in rs]
        rows.append([scenario, policy, tree, len(rs), f"{good[len(good) // 2]:.2f} ({good[0]:.2f}-{good[-1]:.2f})",
                     f"{min(p99):.0f}-{max(p99):.0f}", f"{min(gen):.2f}-{max(gen):.2f}",
                     f"{min(others):.2f}-{max(others):.2f}"])
    return harness.table(["scenario", "policy", "tree", "runs", "goodput x cap: median (range)", "p99 ms",
                          "generator cores", "other cores"], rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=float, default=0.0, help="100 %% load, req/s (required but with --summary)")
    ap.add_argument("--policies", default="greedy,adaptive")
    ap.add_argument("--scenarios", default="burst", help="burst, overload, steady:0.5, ... (comma-separated)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--broker", choices=harness.BROKERS, default="kafka")
    ap.add_argument("--baseline", type=Path, help="a checkout whose workers run each row again, for comparison")
    ap.add_argument("--baseline-policies", default=None,
                    help="the policies the baseline runs (default: all; a policy whose code did not change "
                         "need not run twice)")
    ap.add_argument("--summary", type=float, metavar="SINCE", default=None,
                    help="print the table of out/bench/burst.jsonl's rows since this Unix time and exit")
    args = ap.parse_args()
    if args.summary is not None:
        print(summary(OUT / "burst.jsonl", args.summary))
        return 0
    if args.capacity <= 0:
        ap.error("--capacity must be > 0")
    pool = RequestPool()
    trees = [("this", None)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    again = set((args.baseline_policies or args.policies).split(","))
    OUT.mkdir(parents=True, exist_ok=True)
    with local_broker(args.broker) as broker, open(OUT / "burst.jsonl", "a") as log:
        # The first row on a fresh broker ran with it still warming up: its to_worker p99
        # was twice the next row's and it routed 10-40x as many requests (whichever tree
        # ran it, issue 26): a row not kept, first.
        warm = row(broker.bootstrap_servers, pool, args.policies.split(",")[0], "steady:0.5", args.capacity, None)
        print(f"warm-up row (not kept): in-slo {warm['scored_in_slo']}/{warm['sent']}", flush=True)
        for rep in range(args.repeat):
            for scenario in args.scenarios.split(","):
                for policy in args.policies.split(","):
                    # Trees take turns going first, so neither gains from an order effect.
                    for tree, repo in (trees if rep % 2 == 0 else trees[::-1]):
                        if tree == "baseline" and policy not in again:
                            continue
                        r = row(broker.bootstrap_servers, pool, policy, scenario, args.capacity, repo)
                        print(f"{scenario:10s} {policy:9s} {tree:8s} goodput {r['goodput_x_capacity']:.2f}x "
                              f"in-slo {r['scored_in_slo']}/{r['sent']} late {r['scored_late']} routed "
                              f"{r['routed_late']} p50 {r['p50_ms']:.0f} p99 {r['p99_ms']:.0f} ms; "
                              f"{cpu_text(r['cpu_cores'])}; {stages_text(r['stages'])}", flush=True)
                        log.write(json.dumps({"at": time.time(), "rep": rep, "scenario": scenario, "policy": policy,
                                              "tree": tree, "capacity": args.capacity, "broker": args.broker, **r},
                                             default=float) + "\n")
                        log.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
