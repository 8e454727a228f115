"""The publisher thread's Python per request, and the delivery reports' on the source
thread, by batch size: a real Publisher (pipeline/worker/publisher.py) and Outcomes
(pipeline/delivery/outcomes.py) over a ConfluentProducer whose librdkafka is a fake
that keeps each delivery callback and calls them all when polled. No broker, no
model: what is left is the Python a result costs before and after produce().

    .venv/bin/python bench/publisher_cost.py [--batches 1,13,256] [--rounds 20]
        [--baseline TREE]

A drain's batches hold ~13 CTR requests (~260 rows), a live load's one to three: the
publisher's fixed cost per batch (metrics, the answer-time feedback) counts most
there. --baseline TREE runs the same measurement from another tree (e.g. a `git
worktree` of main) in a subprocess, interleaved round by round, so both meet the same
machine load. Thread CPU time, best round of --rounds; figures in docs/PEERS.md,
"Per-request Python, issue 46".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TREE = Path(os.environ.get("PUBLISHER_COST_TREE", Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(TREE))


def measure(sizes: list[int], rounds: int) -> dict[int, tuple[float, float]]:
    """Batch size -> (publisher µs a request, delivery reports µs a request)."""
    from consumers.confluent_backend import ConfluentProducer
    from consumers.offsets import OffsetTracker
    from pipeline.delivery.limits import resolve_limits
    from pipeline.delivery.outage_log import Acks
    from pipeline.delivery.outcomes import Outcomes, Topics
    from pipeline.delivery.stats import WorkerStats
    from pipeline.observe.metrics import WorkerMetrics
    from tests.unit.worker_fakes import finished, make_batch, publisher

    class FakeLibrdkafka:
        def __init__(self) -> None:
            self.callbacks: list = []

        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None) -> None:  # noqa: ANN001
            self.callbacks.append(on_delivery)

        def poll(self, timeout: float = 0.0) -> int:
            done, self.callbacks = self.callbacks, []
            for callback in done:
                callback(None, None)
            return len(done)

    topics = Topics.for_input("in", "out", None, None)
    limits, _ = resolve_limits(requested_request_bytes=512 * 1024, producer_bytes=1_000_000, described={},
                               outgoing=topics.all(), dead_letter_topic=topics.dead_letter, prefix_bytes=1024)
    out: dict[int, tuple[float, float]] = {}
    for n in sizes:
        producer = ConfluentProducer.__new__(ConfluentProducer)
        rdk = producer._producer = FakeLibrdkafka()  # type: ignore[attr-defined]
        producer._bootstrap = ""  # type: ignore[attr-defined]
        metrics = WorkerMetrics("ctr", "static")
        values = [b"r%05d" % i for i in range(n)]
        results = [{"request_id": v.decode(), "item_ids": [f"i{j}" for j in range(20)], "scores": [0.5] * 20}
                   for v in values]
        best_pub = best_ack = float("inf")
        for r in range(rounds + 3):  # the first rounds warm up
            tracker = OffsetTracker()
            outcomes = Outcomes(producer, Acks(tracker), topics, limits, metrics=metrics, pipeline="ctr", fail=print)
            pub = publisher(outcomes, tracker, [], WorkerStats(), metrics)  # type: ignore[arg-type]
            tracker.track_many([(("in", 0), i) for i in range(n)])
            done = finished(make_batch(values), results)
            t0 = time.thread_time()
            pub.publish_part(done)
            t1 = time.thread_time()
            rdk.poll()
            t2 = time.thread_time()
            if r >= 3:
                best_pub, best_ack = min(best_pub, t1 - t0), min(best_ack, t2 - t1)
        out[n] = (best_pub / n * 1e6, best_ack / n * 1e6)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,13,256", help="batch sizes in requests, comma-separated")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--baseline", type=Path, default=None, help="a tree to measure the same way, interleaved")
    ap.add_argument("--json", action="store_true", help="one JSON object (what --baseline reads)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.batches.split(",")]
    if args.json:
        print(json.dumps(measure(sizes, args.rounds)))
        return 0
    rows: dict[str, list[dict[int, tuple[float, float]]]] = {"this tree": []}
    if args.baseline:
        rows["baseline"] = []
    for _ in range(3):  # interleaved: both trees meet the same load
        for name in rows:
            tree = args.baseline if name == "baseline" else TREE
            env = {**os.environ, "PUBLISHER_COST_TREE": str(tree)}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--batches", args.batches, "--rounds",
                   str(args.rounds), "--json"]
            got = json.loads(subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True,
                                            text=True).stdout)
            rows[name].append({int(k): tuple(v) for k, v in got.items()})
    print(f"{'tree':<10} {'batch':>5} {'publisher µs/req':>17} {'acks µs/req':>12}  (best of 3 runs)")
    for name, runs in rows.items():
        for n in sizes:
            pub = min(r[n][0] for r in runs)
            ack = min(r[n][1] for r in runs)
            print(f"{name:<10} {n:>5} {pub:>17.2f} {ack:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
