"""The `generate` pipeline, none / static / continuous batching, on the real pipeline
(issue 25, "Measure"): a `tidebatch generate` worker per policy on the embedded broker,
the same requests for each (prompts from the project's docs, max_new_tokens
log-uniform over 8..200), in one run:

1. saturation: a preloaded backlog drained; generated tokens/s from the first output
   record to the last final record (Kafka timestamps);
2. steady Poisson loads at 25/50/90 % of the request rate continuous batching drained
   in step 1: tokens/s over the window, TTFT p50/p99 and request latency p99 (the
   final records' own ttft_ms and latency_ms, from each request's Kafka timestamp),
   and the Kafka hop's p50:p99 (their to_worker_ms: timestamp to the worker's poll),
   which `tidebatch simulate --workload generate --hop-ms` takes to predict the rows.

    .venv/bin/python bench/generation.py [--seconds 10] [--backlog 200] [--policies continuous,static,none]
                                         [--loads 0.25,0.5,0.9] [--repeat 1]

Every line gives the cores the bench process (load generator and result reader), the
worker and the broker used meanwhile: they share this machine's cores, so compare rows
of one run, not runs. Requests have a 5 s admission deadline in the load phases: an
overloaded policy (none, from 25 %) expires what waits longer (the `deadline` column)
instead of building a backlog that outlasts the window.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (  # noqa: E402
    OUT,
    cpu_shares,
    cpu_text,
    local_broker,
    open_loop,
    preload,
    profile_of,
    stop_process,
    table,
)
from consumers.admin import ensure_topics  # noqa: E402
from consumers.profiles import consumer_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONTEXT = 256


class GenPool:
    """Generate requests: prompts cut from docs/GENERATION.md, max_new_tokens
    log-uniform over 8..200 (the same list for every policy: same seed)."""

    def __init__(self, size: int = 4000, seed: int = 5, deadline_ms: int | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.deadline_ms = deadline_ms  # the requests' own admission deadline; None: the worker's
        text = (REPO / "docs" / "GENERATION.md").read_text()
        self.items = []
        for _ in range(size):
            n = int(rng.integers(8, 48))
            at = int(rng.integers(0, len(text) - n))
            prompt = text[at:at + n].encode("utf-8", "ignore")[:48].decode("utf-8", "ignore") or "Kafka"
            out = int(np.exp(rng.uniform(np.log(8), np.log(200))))
            self.items.append((prompt, min(out, CONTEXT - len(prompt.encode()))))

    def get(self, i: int, run: str, priority: int | None = None, tenant: str | None = None) -> tuple[bytes, bytes]:
        # `priority` and `tenant`: the pool interface of bench/harness.py's open_loop;
        # generate requests carry neither.
        prompt, n = self.items[i % len(self.items)]
        rid = f"{run}-{i}"
        doc = {"request_id": rid, "prompt": prompt, "max_new_tokens": n}
        if self.deadline_ms is not None:
            doc["deadline_ms"] = self.deadline_ms
        return rid.encode(), orjson.dumps(doc)


class Reader:
    """The output topic's records as they arrive: per request its first record's and
    its final's Kafka timestamps, and the final itself."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.first_ms: dict[str, int] = {}
        self.finals: dict[str, tuple[int, dict]] = {}
        self._c = Consumer(consumer_config(profile_of(bootstrap), bootstrap, f"bench-read-{uuid.uuid4().hex[:8]}"))
        self._c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for m in self._c.consume(500, 0.1):
                if m.error():
                    continue
                d = orjson.loads(m.value())
                ts = m.timestamp()[1]
                self.first_ms.setdefault(d["request_id"], ts)
                if d["final"]:
                    self.finals.setdefault(d["request_id"], (ts, d))

    def done(self, run: str) -> int:
        return sum(1 for k in list(self.finals) if k.startswith(run + "-"))

    def of(self, run: str) -> list[tuple[int, dict]]:
        return [v for k, v in list(self.finals.items()) if k.startswith(run + "-")]

    def close(self) -> None:
        self._stop.set()
        self._t.join(5)
        self._c.close()


def start_worker(bootstrap: str, inp: str, out: str, policy: str, slots: int) -> subprocess.Popen:
    log = OUT / f"generate-{policy}.log"
    cmd = [sys.executable, "-m", "pipeline.cli", "generate", "--bootstrap-servers", bootstrap,
           "--broker-profile", profile_of(bootstrap), "--group-id", f"bench-gen-{uuid.uuid4().hex[:8]}",
           "--input-topic", inp, "--output-topic", out, "--policy", policy, "--max-slots", str(slots),
           "--no-create-topics", "--deadline-ms", "5000", "--max-new-tokens", "248", "--metrics-port", "0"]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    until = time.monotonic() + 90
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited {proc.returncode}; see {log}")
        if "assigned [" in log.read_text(errors="replace"):
            time.sleep(1.0)
            return proc
        time.sleep(0.2)
    raise RuntimeError(f"worker got no partition in 90 s; see {log}")


def wait_for(reader: Reader, run: str, n: int, timeout: float) -> None:
    until = time.monotonic() + timeout
    while reader.done(run) < n and time.monotonic() < until:
        time.sleep(0.1)


def measure(policy: str, bootstrap: str, pool: GenPool, args: argparse.Namespace,
            rate_at_load_1: float | None) -> tuple[list[list[object]], float]:
    tag = uuid.uuid4().hex[:6]
    inp, out = f"gen-{tag}.requests", f"gen-{tag}.results"
    ensure_topics(bootstrap, {inp: 1, out: 1, f"{inp}.dlq": 1})
    reader = Reader(bootstrap, out)
    rows: list[list[object]] = []
    # The backlog goes in before the worker starts: a drain, with no generator running.
    # Its requests carry a deadline of their own, far beyond the load phases' 5 s: the
    # worker takes seconds to start, and a backlog request that expired in the meantime
    # would end at once with no tokens and make the drain look fast (it did: 676
    # requests/s "drained", 13 tokens each).
    preload(bootstrap, inp, GenPool(deadline_ms=600_000), args.backlog, "sat")
    proc = start_worker(bootstrap, inp, out, policy, args.slots)
    try:
        with cpu_shares(bootstrap, proc.pid, machine=True) as shares:
            wait_for(reader, "sat", args.backlog, 240)
        finals = reader.of("sat")
        ok = [(ts, d) for ts, d in finals if d["finish_reason"] != "deadline"]
        first = min(reader.first_ms[k] for k in reader.first_ms if k.startswith("sat-"))
        span = (max(ts for ts, _ in finals) - first) / 1000.0
        tokens = sum(d["generated_tokens"] for _, d in ok)
        capacity = len(ok) / span
        rows.append([policy, "saturation", f"{tokens / span:,.0f}", "-", "-", "-", "-", len(ok), len(finals) - len(ok),
                     cpu_text(shares)])
        base = rate_at_load_1 or capacity
        for load in args.loads:
            run = f"l{int(load * 100)}"
            with cpu_shares(bootstrap, proc.pid, machine=True) as shares:
                sent = open_loop(bootstrap, inp, pool, base * load, args.seconds, run, seed=int(load * 100))
                wait_for(reader, run, sent, 30)
            got = reader.of(run)
            ok = [d for _, d in got if d["finish_reason"] != "deadline"]
            ttft = np.array([d["ttft_ms"] for d in ok]) if ok else np.array([np.nan])
            lat = np.array([d["latency_ms"] for d in ok]) if ok else np.array([np.nan])
            # the Kafka hop (and any backlog in the topic): what `tidebatch simulate --hop-ms` takes
            hop = np.array([d["to_worker_ms"] for d in ok]) if ok else np.array([np.nan])
            tps = sum(d["generated_tokens"] for d in ok) / args.seconds
            rows.append([policy, f"{load:.2f}", f"{tps:,.0f}", f"{np.percentile(ttft, 50):.0f}",
                         f"{np.percentile(ttft, 99):.0f}", f"{np.percentile(lat, 99):.0f}",
                         f"{np.percentile(hop, 50):.1f}:{np.percentile(hop, 99):.1f}", len(ok),
                         len(got) - len(ok) + sent - len(got), cpu_text(shares)])
        return rows, capacity
    finally:
        stop_process(proc)
        reader.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="window of each steady load")
    ap.add_argument("--backlog", type=int, default=200, help="requests drained at saturation")
    ap.add_argument("--slots", type=int, default=16, help="--max-slots of the worker")
    ap.add_argument("--policies", default="continuous,static,none")
    ap.add_argument("--loads", default="0.25,0.5,0.9",
                    help="steady loads after each drain, fractions of load 1; '' for drains only")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds of the policies, interleaved, each printed (load 1: the first round's)")
    args = ap.parse_args()
    args.loads = [float(x) for x in args.loads.split(",") if x]
    policies = args.policies.split(",")
    if policies[0] != "continuous":
        ap.error("continuous comes first: its drained request rate is load 1")
    pool = GenPool()
    rows: list[list[object]] = []
    sat: dict[str, list[float]] = {}
    with local_broker("tansu") as broker:
        load_1 = None
        for rnd in range(args.repeat):
            for policy in policies:
                got, capacity = measure(policy, broker.bootstrap_servers, pool, args, load_1)
                load_1 = load_1 or capacity
                rows += [[rnd + 1, *row] for row in got]
                sat.setdefault(policy, []).append(float(got[0][2].replace(",", "")))
    print(f"load 1 = {load_1:.2f} requests/s (continuous's drain); {args.slots} KV slots; "
          f"max_new_tokens log-uniform 8..200; {os.cpu_count()} cores")
    print(table(["round", "policy", "load", "tokens/s", "ttft_p50_ms", "ttft_p99_ms", "lat_p99_ms",
                 "to_worker_p50:p99_ms", "finished",
                 "deadline", "cores (generator+reader / worker / broker / rest of the machine / stolen)"], rows))
    if "static" in sat and "continuous" in sat:
        ratios = ", ".join(f"{c / s:.2f}x" for c, s in zip(sat["continuous"], sat["static"], strict=True))
        print(f"saturation: continuous / static tokens/s per round = {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
