"""Issue 23, Part 2: a backlog drain's throughput and CPU per request, `tidebatch run`
against a plain consumer loop, side by side in one run (docs/OPERATIONS.md, "Drain
throughput").

    .venv/bin/python bench/drain_cpu.py [--broker tansu|kafka] [--requests 10000]
        --cases loop-json,static-json,static-json+mp,... [--rounds 1]
        [--loop SCRIPT] [--baseline TREE]

A case is WHO-ENCODING[+FLAG...]: WHO is `loop` (the plain loop of --loop), a policy
(`static`, `adaptive`: `tidebatch run` from this tree) or `base-POLICY` (`tidebatch
run` from --baseline, e.g. a `git worktree` of main); ENCODING is `json` or `binary`
(pipeline/codecs/ctr_binary.py); FLAGs set runtime keys: `mp` (model process), `pin`
(pin_executors), `gil1`/`gil5` (gil_switch_interval_ms), `ex2` (2 executors).

--loop SCRIPT is run as `SCRIPT PROFILE BOOTSTRAP INPUT OUTPUT N BATCH GROUP`: it
consumes N requests in polls of up to BATCH from INPUT (group GROUP), produces one
result per request to OUTPUT, and prints `CPU <seconds>` (its own process time from
its first poll with records to its last flush) as its last line.

Per case: rows/s from the first to the last result's timestamp (the drain), worker
CPU-seconds per 10k requests (every thread of the worker and of its model process;
the loop's own figure), the worker's CPU per thread by kernel name
(pipeline/runtime/thread_names.py), and the cores the whole machine was busy meanwhile
and this bench process used: on a shared 2-core machine a drain means little without
them. Every case gets a broker of its own (bench/harness.py `local_broker`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
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
    machine_cpu_seconds,
    preload,
    profile_of,
    read_results,
    table,
)
from consumers.brokers.embedded import free_port  # noqa: E402
from pipeline.runtime.thread_names import cpu_seconds_by_thread  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FLAGS = {
    "mp": {"TIDEBATCH_RUNTIME__MODEL_PROCESS": "true"},
    "pin": {"TIDEBATCH_RUNTIME__PIN_EXECUTORS": "true"},
    "gil1": {"TIDEBATCH_RUNTIME__GIL_SWITCH_INTERVAL_MS": "1"},
    "gil5": {"TIDEBATCH_RUNTIME__GIL_SWITCH_INTERVAL_MS": "5"},
    "ex2": {"TIDEBATCH_RUNTIME__EXECUTORS": "2"},
}
LOOP_BATCH = 64  # issue 23: consume(64, 10 ms) was the best plain loop (37.2k rows/s)


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live children (the model process)."""
    total = cpu_seconds(pid)
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
                total += tree_cpu(int(child))
    except OSError:
        pass
    return total


def wait_records(metrics_url: str, n: int, timeout: float = 600.0) -> None:
    """Until the worker reports n outcomes; scraped once a second (five scrapes a
    second cost this process and the worker ~0.2 of a core between them)."""
    from pipeline.app.demo import _sum, scrape

    deadline = time.monotonic() + timeout
    while _sum(scrape(metrics_url), "tidebatch_records_total") < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {n} outcomes in {timeout} s")
        time.sleep(1.0)


def wait_assigned(proc: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    """Until the worker logs its assignment, read every 20 ms: from then on it drains
    the backlog, and its CPU must be counted from there (harness._wait_assigned scrapes
    /metrics and then waits a second, a second of the drain's CPU lost), and not before
    (loading and warming up the model)."""
    deadline = time.monotonic() + timeout
    while b"partitions: assigned" not in log.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker got no partitions (exit code {proc.returncode}); see {log}")
        time.sleep(0.02)


def drain_worker(bootstrap: str, inp: str, out: str, policy: str, tree: Path, env: dict, log: Path, n: int) -> dict:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree), "TIDEBATCH_METRICS__PORT": str(port),
           "TIDEBATCH_CREATE_TOPICS": "false", **env}
    cmd = [sys.executable, "-m", "pipeline.cli", "run", "--pipeline", "ctr", "--bootstrap-servers", bootstrap,
           "--broker-profile", profile_of(bootstrap), "--policy", policy, "--group-id", f"drain-{uuid.uuid4().hex[:8]}",
           "--input-topic", inp, "--output-topic", out]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tree)
    try:
        wait_assigned(proc, log)
        cpu0, threads0 = tree_cpu(proc.pid), cpu_seconds_by_thread(proc.pid)
        wait_records(f"http://127.0.0.1:{port}/metrics", n)
        cpu, threads1 = tree_cpu(proc.pid) - cpu0, cpu_seconds_by_thread(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    threads = {k: round(v - threads0.get(k, 0.0), 2) for k, v in threads1.items() if v - threads0.get(k, 0.0) >= 0.05}
    return {"cpu_s": cpu, "threads": threads}


def drain_loop(bootstrap: str, inp: str, out: str, script: Path, log: Path, n: int) -> dict:
    cmd = [sys.executable, str(script), profile_of(bootstrap), bootstrap, inp, out, str(n), str(LOOP_BATCH),
           f"loop-{uuid.uuid4().hex[:8]}"]
    with open(log, "wb") as fh:
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)},
                       cwd=REPO, check=True, timeout=600)
    return {"cpu_s": float(log.read_text().rsplit("CPU ", 1)[1].split()[0]), "threads": {}}


def run_case(bootstrap: str, case: str, pools: dict[str, RequestPool], n: int, args: argparse.Namespace) -> dict:
    who, rest = case.split("-", 1) if not case.startswith("base-") else ("base-" + case[5:].split("-")[0],
                                                                         case[5:].split("-", 1)[1])
    encoding, *flags = rest.split("+")
    env = {k: v for f in flags for k, v in FLAGS[f].items()}
    inp, out = fresh_topics(bootstrap, f"drain-{encoding}", partitions=4)
    run = f"d{uuid.uuid4().hex[:6]}"
    preload(bootstrap, inp, pools[encoding], n, run)
    log = OUT / f"drain-{case}.log"
    machine0, bench0, wall0 = machine_cpu_seconds()[0], time.process_time(), time.monotonic()
    if who == "loop":
        got = drain_loop(bootstrap, inp, out, args.loop, log, n)
    else:
        tree = args.baseline if who.startswith("base-") else REPO
        got = drain_worker(bootstrap, inp, out, who.removeprefix("base-"), tree, env, log, n)
    wall = time.monotonic() - wall0
    machine, bench = (machine_cpu_seconds()[0] - machine0) / wall, (time.process_time() - bench0) / wall
    res = read_results(bootstrap, out, n, timeout=300, run=run)
    drop_topics(bootstrap, inp, out)
    req_s, rows_s = drain_throughput(res)
    # The cores it got: its CPU over the drain's span (first to last result).
    return {"case": case, "results": len(res.docs), "rows_per_s": rows_s, "cpu_s_per_10k": got["cpu_s"] * 1e4 / n,
            "cores": got["cpu_s"] * req_s / n,
            "machine_cores": machine, "bench_cores": bench, "threads": got["threads"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--broker", default="tansu", choices=["tansu", "kafka"])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--loop", type=Path, help="the plain loop script (for `loop-*` cases)")
    ap.add_argument("--baseline", type=Path, help="a tree to run `base-*` cases from (e.g. a worktree of main)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    pools = {"json": RequestPool(encoding="json"), "binary": RequestPool(encoding="binary")}
    rows = []
    for r in range(args.rounds):
        for case in args.cases.split(","):
            with local_broker(args.broker) as broker:
                got = run_case(broker.bootstrap_servers, case, pools, args.requests, args)
            print(json.dumps({**got, "round": r}), flush=True)
            rows.append([case, r, got["results"], f"{got['rows_per_s']:.0f}", f"{got['cpu_s_per_10k']:.2f}", f"{got['cores']:.2f}",
                         f"{got['machine_cores']:.2f}", f"{got['bench_cores']:.2f}",
                         " ".join(f"{k} {v}" for k, v in sorted(got["threads"].items(), key=lambda kv: -kv[1]))])
    print(table(["case", "round", "results", "rows/s", "CPU-s/10k req", "cores it got", "machine cores", "bench cores",
                 "worker CPU-s by thread"], rows))


if __name__ == "__main__":
    main()
