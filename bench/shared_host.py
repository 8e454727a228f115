"""One shared model host against a model process per worker: N client processes, each
sending CTR batches of 64 rows back to back (one or several in flight, as a worker's
executors do through a backlog), for a few seconds.

    flock /tmp/heavy.lock .venv/bin/python bench/shared_host.py [--clients 2,4] [--in-flight 1,4] [--host-threads 1,2] [--seconds 3] [--repeats 2]

Cases run side by side, alternating (shared with each --host-threads, own, ...), so
that a machine shared with other jobs loads them alike. A model process per client
runs 1 intra-op thread; the shared host runs --host-threads (one host per device: on
a CPU the device is all its cores, so a host of 1 thread uses one where N model
processes use N). Per case: rows/s over all clients, the model's calls per second
(the host's own count when shared; one call per batch otherwise), requests and rows
per call. Prints one JSON object: the cases, the median of each figure per (clients,
in flight, mode), and the ratios of shared to own; CPU provider. Every client walks a
pool of distinct batches, so no batch is served from a warm cache (bench/model_peak.py
says why that matters).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from models.registry import load_spec  # noqa: E402
from pipeline.runtime.model_process import ProcessSession  # noqa: E402
from pipeline.runtime.shared_host import SharedModelHost  # noqa: E402

ROWS = 64
POOL = 200  # distinct batches per client (12,800 rows)


def batches(seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(POOL):
        dense = rng.exponential(5.0, (ROWS, 13)).astype(np.float32)
        out.append({"dense": dense, "cat": rng.integers(0, 65536, (ROWS, 26), dtype=np.int64)})
    return out


def client(address: str | None, seconds: float, seed: int, in_flight: int, barrier: Any, counts: Any) -> None:
    """One worker: `in_flight` threads (the worker's executors) sending batches back to back."""
    pool = batches(seed)
    session = ProcessSession(load_spec("ctr").onnx_path, "cpu", 1, address=address)
    done = [0] * in_flight

    def send(k: int, end: float) -> None:
        n = k
        while time.monotonic() < end:
            session.run(pool[n % POOL])
            n += in_flight
            done[k] += 1

    try:
        for f in pool[:10]:
            session.run(f)  # warm: the first calls of a shape allocate
        barrier.wait()
        end = time.monotonic() + seconds
        threads = [threading.Thread(target=send, args=(k, end)) for k in range(in_flight)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts.put(sum(done))
    finally:
        session.close()


def one_case(clients: int, host_threads: int, in_flight: int, seconds: float, folder: str) -> dict[str, Any]:
    """host_threads 0: a model process per client (1 intra-op thread each)."""
    ctx = mp.get_context("spawn")
    barrier, counts = ctx.Barrier(clients + 1), ctx.Queue()
    shared = host_threads > 0
    host = SharedModelHost(os.path.join(folder, "host.sock"), "cpu", host_threads).start() if shared else None
    try:
        procs = [
            ctx.Process(target=client, args=(host.address if host else None, seconds, 1000 * k, in_flight, barrier, counts))
            for k in range(clients)
        ]
        for p in procs:
            p.start()
        barrier.wait(120)
        before = host.stats() if host else None
        t0 = time.monotonic()
        got = [counts.get(timeout=seconds + 120) for _ in procs]
        wall = time.monotonic() - t0
        after = host.stats() if host else None
        for p in procs:
            p.join(60)
    finally:
        if host is not None:
            host.stop()
    requests = sum(got)
    calls = (after["calls"] - before["calls"]) if after and before else requests
    return {
        "clients": clients, "in_flight": in_flight, "mode": f"shared-{host_threads}t" if shared else "own",
        "rows_per_s": round(requests * ROWS / wall), "calls_per_s": round(calls / wall),
        "requests_per_call": round(requests / max(calls, 1), 2), "rows_per_call": round(requests * ROWS / max(calls, 1), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="2,4")
    ap.add_argument("--host-threads", default="1,2", help="the shared host's intra-op threads, one case each")
    ap.add_argument("--in-flight", default="1,4", help="batches in flight per client (its executors), one case each")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    cases = []
    with tempfile.TemporaryDirectory(prefix="tidebatch-host-") as folder:
        for _ in range(args.repeats):
            for n in (int(x) for x in args.clients.split(",")):
                for depth in (int(x) for x in args.in_flight.split(",")):
                    for threads in [*(int(t) for t in args.host_threads.split(",")), 0]:
                        cases.append(one_case(n, threads, depth, args.seconds, folder))
    def key(c: dict[str, Any]) -> str:
        return f"{c['clients']} clients x{c['in_flight']} {c['mode']}"

    medians = {
        key(c): {f: statistics.median(o[f] for o in cases if key(o) == key(c))
                 for f in ("rows_per_s", "calls_per_s", "requests_per_call")}
        for c in cases
    }
    ratios = {
        f"{k} / own rows_per_s": round(m["rows_per_s"] / medians[k.rsplit(" ", 1)[0] + " own"]["rows_per_s"], 2)
        for k, m in medians.items() if not k.endswith(" own")
    }
    print(json.dumps({
        "cores": os.cpu_count(), "load_1m_before": load_before, "load_1m_after": os.getloadavg()[0],
        "seconds": args.seconds, "rows_per_batch": ROWS, "cases": cases, "medians": medians, "ratios": ratios,
    }, indent=1))


if __name__ == "__main__":
    main()
