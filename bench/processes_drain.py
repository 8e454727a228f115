"""`tidebatch run --processes 1` against `--processes 2` (issue 46), side by side in one
run: a backlog of binary CTR requests drained on a broker of its own, the cases taking
turns. The host is ready (every child owns partitions) before the backlog is written,
so a drain measures the processes, not the group's first join; the backlog is written
as fast as the bench's producer goes, while the drain starts.

    .venv/bin/python bench/processes_drain.py [--broker tansu|kafka] [--requests 20000]
        [--processes 1,2] [--repeat 1] [--encoding binary|json]

Per case: requests/s and rows/s from the first to the last result's produce
timestamp, and the worker's CPU seconds per 10k requests, the parent and its children
together (/proc: a child's CPU counts in its parent only once it is reaped). Prints a
table and writes out/bench/processes_drain.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    OUT,
    RequestPool,
    cpu_seconds,
    drain_throughput,
    drop_topics,
    fresh_topics,
    local_broker,
    preload,
    read_results,
    table,
    wait_outcomes,
    worker_process,
)

PARTITIONS = 4
NO_SLO = {"TIDEBATCH_BATCHING__SLO_MS": "3600000"}  # a backlog is older than any SLO


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu_seconds(p)
        todo += children.get(p, [])
    return total


def _ready(url: str, timeout: float = 120.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} never answered 200")


def drain(bootstrap: str, pool: RequestPool, processes: int, n: int) -> dict:
    inp, out = fresh_topics(bootstrap, f"bench-p{processes}-{pool.encoding}", partitions=PARTITIONS)
    run = f"p{processes}"
    env = {**NO_SLO, "TIDEBATCH_RUNTIME__PROCESSES": str(processes)}
    with worker_process(bootstrap, inp, out, "adaptive", extra_env=env, log_name=f"processes-{run}") as proc:
        _ready(proc.metrics_url.replace("/metrics", "/readyz"))
        cpu0 = tree_cpu_seconds(proc.pid)
        preload(bootstrap, inp, pool, n, run)
        wait_outcomes(proc, n)
        cpu = tree_cpu_seconds(proc.pid) - cpu0
        res = read_results(bootstrap, out, n, timeout=300, run=run)
    drop_topics(bootstrap, inp, out)
    req_s, rows_s = drain_throughput(res)
    return {"processes": processes, "requests_per_s": req_s, "rows_per_s": rows_s, "results": len(res.docs),
            "worker_cpu_s_per_10k": cpu / n * 10_000}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--processes", default="1,2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--encoding", choices=("binary", "json"), default="binary")
    args = ap.parse_args()
    counts = [int(x) for x in args.processes.split(",")]
    pool = RequestPool(encoding=args.encoding)
    runs: list[dict] = []
    with local_broker(args.broker) as broker:
        for r in range(args.repeat):
            for p in counts:
                got = drain(broker.bootstrap_servers, pool, p, args.requests)
                runs.append({**got, "round": r})
                print(f"processes {p}: {got['rows_per_s']:.0f} rows/s, {got['requests_per_s']:.0f} requests/s, "
                      f"{got['worker_cpu_s_per_10k']:.2f} worker CPU s per 10k", flush=True)
    base = {r["round"]: r["rows_per_s"] for r in runs if r["processes"] == counts[0]}
    rows = [[r["round"], r["processes"], f"{r['requests_per_s']:.0f}", f"{r['rows_per_s']:.0f}",
             f"{r['rows_per_s'] / base[r['round']]:.2f}x", f"{r['worker_cpu_s_per_10k']:.2f}"] for r in runs]
    print(table(["round", "processes", "requests/s", "rows/s", f"vs {counts[0]}", "CPU s/10k"], rows))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "processes_drain.json").write_text(json.dumps({"broker": args.broker, "encoding": args.encoding,
                                                          "requests": args.requests, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
